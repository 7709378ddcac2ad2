"""A server as the policy pack judges it, and the rules every engine's servers get from its own facts.

The pack (policies/rules/engines.py) turns each rule here, and each engine's own `Engine.policy_rules`
(components/engines/<engine>/rules.py), into a policy over the ModelServers of that engine. A check is a
pure function of a `JudgedServer`: the messages it returns are the violations, one per pool.

An engine whose rules need its own parse of a launch, and judge containers added outside the components too,
gives `LaunchRule`s instead (`Engine.launch_rules`): the pack lists each under its topic's module.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from components.engines.cli_dump import build_parser, parse_errors
from components.facts.hardware import GpuModel

if TYPE_CHECKING:
    from components.engines.base import Engine

Check = Callable[["JudgedServer"], list[str]]
_PARSERS: dict[tuple[str, str, str], argparse.ArgumentParser] = {}  # (engine, dump, program) -> its parser


def number(value: Any) -> int | None:
    """Props arrive with numbers as floats (mocks, the engine's Struct): 8.0 -> 8; None stays None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class EngineRule:
    """One policy over an engine's servers: its name in the pack, what it checks, and how hard."""

    name: str
    description: str
    check: Check
    advisory: bool = False


class Launch(Protocol):
    """What the pack reads of any engine's launch (the engine's own type carries the rest): the GPU it runs on."""

    gpu_name: str | None
    gpu: GpuModel | None


@dataclass(frozen=True)
class LaunchRule:
    """One policy over an engine's launches (`Engine.model_server_launch`, `Engine.container_launch`).

    `topic` is the pack module that lists it (policies/rules/<topic>.py: hardware, image, topology, flags,
    engine_args, host_memory), which fixes its place in the pack; `config` holds the JSON-schema properties of
    the policy's config. `ray_node_image` also judges the image of every Ray node (RayCluster, a raw Ray
    container): why it cannot run one of the engine's multi-node instances, or None."""

    topic: str
    name: str
    description: str
    check: Callable[[Any, Mapping[str, Any]], list[str]]
    advisory: bool = False
    config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    needs_gpu: bool = True
    ray_node_image: Callable[[str | None, Mapping[str, Any]], str | None] | None = None


@dataclass(frozen=True)
class ServerCall:
    """An engine's server as a container states it: the program and the options its own parser read (by dest)."""

    program: str
    options: Mapping[str, Any]


class JudgedServer:
    """A ModelServer's props read for the rules: its engine, GPU, image facts and its argv parsed by the image's CLI."""

    def __init__(self, engine: Engine, props: Mapping[str, Any], gpu: GpuModel):
        self.engine = engine
        self.props = props
        self.gpu = gpu
        self.image = str(props.get("image") or "")
        self.argv = [str(t) for t in props.get("argv") or []]
        self.facts = engine.image_facts_of(self.image)

    @property
    def where(self) -> str:
        """'Tesla V100-SXM2-32GB (sm_70)'."""
        return f"{self.gpu.name} (sm_{self.gpu.capability})"

    @property
    def cap(self) -> int:
        """The GPU's compute capability (70 for sm_70)."""
        return self.gpu.capability

    def tail(self) -> list[str]:
        """The arguments after the program (`lmdeploy serve api_server` / `llama-server`)."""
        return self.argv[len(self.engine.cli_program.split()) :]

    def parser(self) -> argparse.ArgumentParser:
        """The image's own CLI, rebuilt from its dump (once per engine and dump: parsing leaves it as it was)."""
        key = (self.engine.name, self.facts.serve_args, self.engine.cli_program)
        if key not in _PARSERS:
            _PARSERS[key] = build_parser(self.facts.serve_args, self.engine.cli_program, self.engine.cli_value_types())
        return _PARSERS[key]

    def args(self) -> argparse.Namespace | None:
        """The argv parsed by the image's own (dumped) parser; None when it does not parse or is unknown."""
        if self.facts is None:
            return None
        try:
            ns, _ = self.parser().parse_known_args(self.tail())
        except Exception:  # noqa: BLE001 - engine-flags reports the parse error itself
            return None
        return ns


def check_image(s: JudgedServer) -> list[str]:
    """The image's engine build has kernels for the GPU (the CUDA 13 builds have none for Volta)."""
    if s.facts is None or s.facts.runs_on(s.cap):
        return []  # an unknown image: engine-image-unknown (advisory)
    working = [ref for ref, f in s.engine.image_table().items() if f.runs_on(s.cap)]
    return [
        f"image {s.image} has no kernels for {s.where}: {s.facts.note} ({s.facts.cite('sass')}). "
        f"Use {' or '.join(working)}"
    ]


def check_image_known(s: JudgedServer) -> list[str]:
    """Advisory: an image the facts table does not know cannot be judged (a private build, a rolling tag)."""
    if s.facts is not None:
        return []
    known = sorted(s.engine.image_table())
    return [
        f"image {s.image} is not in the {s.engine.name} facts table, so nothing says it runs on {s.where} and "
        f"its flags cannot be checked; capacity is sized as the default image's. Known: {', '.join(known)} "
        f"(components/engines/{s.engine.name}/facts.py)"
    ]


def check_flags(s: JudgedServer) -> list[str]:
    """Every flag exists in the image's CLI with a valid value (the parser rebuilt from its dump)."""
    if s.facts is None:
        return []
    program = s.engine.cli_program
    out = [f"{program} ({s.image}): {e}" for e in parse_errors(s.parser(), s.tail())]
    refused = s.engine.refused_flags
    for token in s.tail():
        flag = token.partition("=")[0]
        if flag in refused:
            out.append(f"{program}: {flag} is refused: {refused[flag]}")
    return out


def check_capacity_modelled(s: JudgedServer) -> list[str]:
    """The engine's capacity model could size the pool (else memory fit cannot be judged: say why)."""
    capacity = s.props.get("capacity")
    if isinstance(capacity, Mapping) and capacity.get("error"):
        return [f"{capacity['error']}: memory fit cannot be judged; fix the pool or model it names"]
    return []


def advice_fit_problems(capacity: Mapping[str, Any]) -> list[str]:
    """A pool that does not fit, told the fixes its engine's capacity model gives (`advice`, in its own option
    names); nothing when it fits or the model gives none."""
    if capacity.get("fits") is False and capacity.get("advice"):
        return [f"does not fit: {capacity.get('reason')}. To fit: {capacity['advice']}."]
    return []


# The rules every engine judged from its image table gets; `{engines}` is their titles.
COMMON_RULES = (
    EngineRule("engine-image", "The engine image has kernels for the pool's GPU ({engines}).", check_image),
    EngineRule(
        "engine-image-unknown",
        "The engine image is one the facts table knows ({engines}).",
        check_image_known,
        advisory=True,
    ),
    EngineRule(
        "engine-flags", "Every flag exists in the engine image's own CLI with a valid value ({engines}).", check_flags
    ),
    EngineRule(
        "engine-capacity",
        "The engine's capacity model sizes the pool (heads divisible by TP, weights known).",
        check_capacity_modelled,
    ),
)
