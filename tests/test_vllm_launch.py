"""Which vLLM server an argv or a container starts (components.engines.vllm.launch), as a table: the program
(`vllm serve` or the api_server module), its arguments, also inside a `bash -c` script, and the Launch the
vLLM policy rules judge, read from a ModelServer's and a container's props. A server missed here is a
server the policy pack does not judge at preview."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.vllm.facts import image_facts
from components.engines.vllm.launch import (
    API_SERVER,
    SERVE,
    container_launch,
    container_server,
    model_server_launch,
    serve_tokens,
    server_tokens,
)
from components.facts.hardware import GPUS

V92 = "vllm/vllm-openai:v0.9.2"
V19 = "vllm/vllm-openai:v0.19.1"
V100 = "Tesla V100-SXM2-32GB"

# (argv, (program, its arguments) or None).
SERVERS: list[tuple[list[str], tuple[str, list[str]] | None]] = [
    (["vllm", "serve", "/m", "--seed", "1"], (SERVE, ["/m", "--seed", "1"])),
    (["/usr/local/bin/vllm", "serve", "/m"], (SERVE, ["/m"])),
    (["env", "X=1", "vllm", "serve"], (SERVE, [])),
    (["python3", "-m", API_SERVER, "--model", "/m"], (API_SERVER, ["--model", "/m"])),
    (["python3", "-m", API_SERVER], (API_SERVER, [])),
    # A script: the words after the server's name up to the blank line that ends its command.
    (["bash", "-c", "set -e\nexec vllm serve /m \\\n  --seed 1\n\necho after"], (SERVE, ["/m", "--seed", "1"])),
    (["bash", "-c", "vllm serve"], (SERVE, [])),
    (["bash", "-c", f"python3 -m {API_SERVER} --model /m"], (API_SERVER, ["--model", "/m"])),
    (["bash", "-c", f"python3 -m {API_SERVER}\tmore"], (API_SERVER, ["more"])),
    (["bash", "-c", f"python3 -m {API_SERVER}"], (API_SERVER, [])),
    (["bash", "-c", "vllm serve /m && true"], (SERVE, ["/m", "true"])),
    (["bash", "-c", "vllm serve /m ; true"], (SERVE, ["/m", "true"])),
    (["bash", "-c", "vllm serve /a\n\nvllm serve /b"], (SERVE, ["/a"])),
    # Another module whose name starts like the api_server's is not it.
    (["bash", "-c", f"python3 -m {API_SERVER}s --model /m"], None),
    (["python3", "-m", API_SERVER + "s"], None),
    # A script bash could not split either: nothing to judge.
    (["bash", "-c", "vllm serve '/m"], None),
    (["bash", "-c", f"python3 -m {API_SERVER} --model '/m"], None),
    (["vllm"], None),
    (["vllm", "run", "/m"], None),
    (["vllm-serve", "/m"], None),
    (["ray", "start", "--head"], None),
    (["-m"], None),
    ([], None),
]


@pytest.mark.parametrize(("argv", "found"), SERVERS)
def test_the_server_an_argv_starts(argv: list[str], found: tuple[str, list[str]] | None) -> None:
    assert server_tokens(argv) == found
    assert serve_tokens(argv) == (found[1] if found and found[0] == SERVE else None)


@pytest.mark.parametrize(
    ("script", "program"),
    [
        (f"vllm serve /m\n\npython3 -m {API_SERVER} --model /m", SERVE),
        (f"python3 -m {API_SERVER} --model /m\n\nvllm serve /m", API_SERVER),
    ],
)
def test_in_a_script_the_first_server_is_the_one_read(script: str, program: str) -> None:
    assert server_tokens(["bash", "-c", script]) == (program, ["--model", "/m"] if program == API_SERVER else ["/m"])


@pytest.mark.parametrize(
    ("props", "image", "found"),
    [
        # The vllm/vllm-openai image's ENTRYPOINT is the api_server: the command is its arguments.
        ({"command": ["--model", "/m", 8]}, V92, (API_SERVER, ["--model", "/m", "8"])),
        ({"command": ["--model", "/m"]}, "docker.io/vllm/vllm-openai:v0.9.2", (API_SERVER, ["--model", "/m"])),
        ({"entrypoints": [], "command": ["--model", "/m"]}, V92, (API_SERVER, ["--model", "/m"])),
        ({}, V92, (API_SERVER, [])),
        # Entrypoints given: they and the command are the argv.
        ({"entrypoints": ["vllm"], "command": ["serve", "/m"]}, V92, (SERVE, ["/m"])),
        (
            {"entrypoints": ["python3", "-m", API_SERVER], "command": ["--model", "/m"]},
            V19,
            (API_SERVER, ["--model", "/m"]),
        ),
        # Another image: only what the container's own argv says.
        ({"command": ["vllm", "serve", "/m"]}, "other/img:1", (SERVE, ["/m"])),
        ({"command": ["--model", "/m"]}, "other/img:1", None),
        ({"command": ["vllm", "serve", "/m"]}, None, (SERVE, ["/m"])),
        ({"command": ["--model", "/m"]}, None, None),
    ],
)
def test_the_server_a_container_starts(props: dict[str, Any], image: str | None, found: Any) -> None:
    assert container_server(props, image) == found


def test_a_model_servers_launch_is_read_whole_from_its_props() -> None:
    props = {
        "pool": "chat",
        "argv": ["vllm", "serve", "/data/models/m", "--seed", 3],
        "env": {"VLLM_HOST_IP": "10.0.0.1", "N": 2},
        "gpuModel": V100,
        "arch": "qwen3-8b",
        "quantization": "awq",
        "nodes": ["gpu1", "gpu2"],
        "gpuCount": 4.0,
        "image": V92,
        "modelPath": "/data/models/m",
    }
    launch = model_server_launch(props)
    assert launch is not None
    assert (launch.resource, launch.args.values, launch.args.version) == (
        "ModelServer",
        {"model_tag": "/data/models/m", "seed": "3"},  # 0.9.2's dump names no inner type of --seed
        "0.9.2",
    )
    assert launch.env == {"VLLM_HOST_IP": "10.0.0.1", "N": "2"}
    assert (launch.gpu_name, launch.gpu, launch.capability, launch.where()) == (
        V100,
        GPUS[V100],
        70,
        "Tesla V100-SXM2-32GB (sm_70)",
    )
    assert (launch.arch, launch.quantization, launch.nodes, launch.gpus_per_node) == (
        "qwen3-8b",
        "awq",
        ("gpu1", "gpu2"),
        4,
    )
    assert (launch.image, launch.model_path, launch.props, launch.facts) == (
        V92,
        "/data/models/m",
        props,
        image_facts(V92),
    )


def test_a_model_server_of_another_engine_is_no_vllm_launch_and_vllm_is_the_default() -> None:
    assert model_server_launch({"engine": "lmdeploy", "argv": ["lmdeploy", "serve"]}) is None
    bare = model_server_launch({"argv": ["vllm", "serve", "/m"]})
    assert bare is not None
    assert (bare.args.values, bare.env, bare.gpu, bare.capability, bare.nodes, bare.gpus_per_node, bare.facts) == (
        {"model_tag": "/m"},
        {},
        None,
        None,
        (),
        None,
        None,
    )


def test_a_model_server_whose_argv_starts_no_server_is_parsed_whole() -> None:
    launch = model_server_launch({"argv": ["/m", "--seed", "1"], "image": V19})
    assert launch is not None
    assert launch.args.values == {"model_tag": "/m", "seed": 1}


def test_a_model_servers_declared_image_facts_are_its_own() -> None:
    props = {
        "pool": "chat",
        "argv": ["vllm", "serve", "/m"],
        "image": "registry.local/vllm:custom",
        "imageFacts": {"like": V92},
    }
    launch = model_server_launch(props)
    assert launch is not None and launch.facts is not None
    assert (launch.facts.ref, launch.facts.version, launch.args.version) == (
        "registry.local/vllm:custom",
        "0.9.2",
        "0.9.2",
    )
    # What it declares is sourced to the pool's key, in every message that cites it.
    assert launch.facts.note == "declared by pools.chat.imageFacts, based on vllm/vllm-openai:v0.9.2"


def test_a_containers_launch_is_read_from_its_command_envs_and_gpu_label() -> None:
    props = {
        "command": ["--model", "/data/models/m", "--seed", "2"],
        "envs": ["A=1", "B=x=y"],
        "labels": [{"label": "llm-cluster.gpu-model", "value": V100}],
    }
    launch = container_launch(props, V92)
    assert launch is not None
    assert (launch.resource, launch.args.program, launch.args.values, launch.args.version) == (
        "container",
        API_SERVER,
        {"model": "/data/models/m", "seed": "2"},
        "0.9.2",
    )
    assert (launch.env, launch.gpu_name, launch.gpu, launch.image, launch.model_path) == (
        {"A": "1", "B": "x=y"},
        V100,
        GPUS[V100],
        V92,
        "/data/models/m",
    )
    assert (launch.props, launch.facts, launch.arch, launch.nodes) == (props, image_facts(V92), None, ())


def test_a_container_that_starts_no_vllm_server_has_no_launch() -> None:
    assert container_launch({"command": ["nginx"]}, "nginx:1.27") is None
