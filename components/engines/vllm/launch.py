"""The vLLM server a resource describes: the program an argv starts (`vllm serve` or the api_server, also
inside a `bash -c` script), its arguments parsed by the image's own parser, and the `Launch` the vLLM rules
judge (components/engines/vllm/rules), read from a ModelServer's or a container's props. Pure: the policy
pack hands the props over (policies.rules.common.launch_of)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.engines.containers import GPU_MODEL_LABEL, container_argv, env_of, image_parts, labels
from components.engines.judged import number
from components.engines.vllm.facts import API_SERVER_ENTRYPOINT, VLLM_IMAGE_REPO, ImageFacts, facts_for, image_facts
from components.engines.vllm.serve_args import API_SERVER, SERVE, ServeArgs, parse_serve
from components.facts.hardware import GPUS, GpuModel

# The two ways vLLM 0.9.2 starts its OpenAI server: the `vllm serve` CLI (SERVE), and the module
# (API_SERVER) that the vllm/vllm-openai image runs as its ENTRYPOINT, `python3 -m
# vllm.entrypoints.openai.api_server` (docker/Dockerfile:527 at v0.9.2).
_API_SERVER_IN_SCRIPT = re.compile(r"-m\s+" + re.escape(API_SERVER) + r"(?=\s|$)")


def _script_tail(tail: str) -> list[str] | None:
    """The words of a script after the server's name, up to the end of its command (blank line)."""
    try:
        found = shlex.split(tail.split("\n\n")[0].replace("\\\n", " "))
    except ValueError:
        return None
    return [w for w in found if w not in (";", "&&")]


def server_tokens(argv: list[str]) -> tuple[str, list[str]] | None:
    """(program, its arguments) for the vLLM server an argv starts, also inside a `bash -c` script:
    `vllm serve …` gives (SERVE, …), `python3 -m vllm.entrypoints.openai.api_server …` gives
    (API_SERVER, …); None if it starts neither."""
    for i in range(len(argv) - 1):
        if argv[i].rsplit("/", 1)[-1] == "vllm" and argv[i + 1] == "serve":
            return SERVE, argv[i + 2 :]
        if argv[i] == "-m" and argv[i + 1] == API_SERVER:
            return API_SERVER, argv[i + 2 :]
    for token in argv:
        serve_at = token.find("vllm serve")
        module = _API_SERVER_IN_SCRIPT.search(token)
        if serve_at < 0 and module is None:
            continue
        if module is None or 0 <= serve_at < module.start():
            tail = _script_tail(token[serve_at + len("vllm serve") :])
            return None if tail is None else (SERVE, tail)
        tail = _script_tail(token[module.end() :])
        return None if tail is None else (API_SERVER, tail)
    return None


def serve_tokens(argv: list[str]) -> list[str] | None:
    """The tokens after `vllm serve` in an argv (also inside a `bash -c` script); None if it serves nothing."""
    found = server_tokens(argv)
    return found[1] if found and found[0] == SERVE else None


def container_server(props: Mapping[str, Any], image: str | None) -> tuple[str, list[str]] | None:
    """The vLLM server a container starts: its entrypoints+command, or, without entrypoints on a
    vllm/vllm-openai image, the image's ENTRYPOINT with the command as its arguments: the api_server up to
    0.9.2 (`docker run vllm/vllm-openai:v0.9.2 --model /m …`, the runbook's form), `vllm serve` in 0.19.1
    (`docker run vllm/vllm-openai:v0.19.1 /m …`; the image facts' `entrypoint`; an image without facts is
    read as the api_server). `image` is the ref the container states (the pack's container_image)."""
    if not props.get("entrypoints"):
        if image and image_parts(image)[0] == VLLM_IMAGE_REPO:
            facts = image_facts(image)
            entrypoint = facts.entrypoint if facts is not None else API_SERVER_ENTRYPOINT
            return server_tokens([*entrypoint, *[str(t) for t in props.get("command") or []]])
    return server_tokens(container_argv(props))


def parse_server(found: tuple[str, list[str]], facts: ImageFacts | None = None) -> ServeArgs:
    """Parse a server's arguments with the parser of the program that reads them, of the image's version."""
    program, tokens = found
    return parse_serve(tokens, program=program, facts=facts)


@dataclass(frozen=True)
class Launch:
    """One vLLM server as a resource describes it: argv after `vllm serve`, env, GPU, model, layout."""

    resource: str  # "ModelServer" or "container"
    args: ServeArgs
    env: dict[str, str]
    gpu_name: str | None
    gpu: GpuModel | None
    arch: str | None = None  # model catalog name (ModelServer props)
    quantization: str | None = None  # the checkpoint's method (ModelServer props)
    nodes: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    image: str | None = None
    model_path: str | None = None
    props: Mapping[str, Any] = field(default_factory=dict)
    facts: ImageFacts | None = None  # the image's facts (declared in the stack, or the table's); None: unknown

    @property
    def capability(self) -> int | None:
        """The GPU's compute capability (70 for V100), None when the GPU is not in the facts table."""
        return self.gpu.capability if self.gpu else None

    def where(self) -> str:
        """'Tesla V100-SXM2-32GB (sm_70)' for messages."""
        assert self.gpu is not None
        return f"{self.gpu.name} (sm_{self.gpu.capability})"


def model_server_launch(props: Mapping[str, Any]) -> Launch | None:
    """The launch a ModelServer's props describe; None for another engine's server."""
    if props.get("engine", "vllm") != "vllm":
        return None
    argv = [str(t) for t in props.get("argv") or []]
    tokens = serve_tokens(argv)
    gpu_name = props.get("gpuModel")
    facts = facts_for(props.get("image"), props.get("imageFacts"), f"pools.{props.get('pool')}.imageFacts")
    return Launch(
        resource="ModelServer",
        args=parse_serve(tokens if tokens is not None else argv, facts=facts),
        env=env_of(props.get("env")),
        gpu_name=gpu_name,
        gpu=GPUS.get(str(gpu_name)),
        arch=props.get("arch"),
        quantization=props.get("quantization"),
        nodes=tuple(props.get("nodes") or ()),
        gpus_per_node=number(props.get("gpuCount")),
        image=props.get("image"),
        model_path=props.get("modelPath"),
        props=props,
        facts=facts,
    )


def container_launch(props: Mapping[str, Any], image: str | None) -> Launch | None:
    """The launch a container's props describe (`image`: the ref it states), GPU from its gpu-model label;
    None if it starts no vLLM server."""
    found = container_server(props, image)
    if found is None:
        return None
    gpu_name = labels(props).get(GPU_MODEL_LABEL)
    facts = facts_for(image)
    parsed = parse_server(found, facts)
    return Launch(
        resource="container",
        args=parsed,
        env=env_of(props.get("envs")),
        gpu_name=gpu_name,
        gpu=GPUS.get(str(gpu_name)),
        image=image,
        model_path=parsed.model,
        props=props,
        facts=facts,
    )
