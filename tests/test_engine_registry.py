"""Adding an engine is a package and one registry line: a toy engine, registered from this test module and
touching no other file, is planned end to end (spec, containers, gateway, monitoring, capacity, policies)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import yaml
from pydantic import Field

from components.engines import registry
from components.engines.base import Engine, MultiNode, offline_env
from components.engines.http import EngineServer
from components.engines.judged import LaunchRule, ServerCall
from components.facts.evidence import unverified
from components.facts.hardware import GPUS, GpuModel
from components.planning.load import load_stack_config
from components.planning.nodes.scripts import written_files
from components.spec import SpecError, StackSpec
from components.spec import engines as spec_engines
from components.spec.base import Spec
from components.spec.topology import Instance
from plan.analyze import analyze
from plan.harness import ProgramRun
from policies.rules.common import launch_policies
from policies.rules.security import exposure_found
from tests.conftest import run_stack
from tests.support.engine_stacks import engine_config

CONTAINER = "docker:index/container:Container"
TOY_IMAGE = "example.org/toyserve:1.0"


@dataclass(frozen=True)
class ToyLaunch:
    """A toy server as its own rules read it: its slots, and the GPU it runs on."""

    slots: int
    gpu_name: str | None
    gpu: GpuModel | None


def toy_slots_rule(launch: ToyLaunch, config: Mapping[str, Any]) -> list[str]:
    return (
        [f"--slots {launch.slots} exceeds maxSlots {config['maxSlots']}"] if launch.slots > config["maxSlots"] else []
    )


def toy_options(argv: list[str]) -> dict[str, str]:
    """`toyserve --port 8000 --slots 2` -> {"port": "8000", "slots": "2"}."""
    return {flag[2:]: value for flag, value in zip(argv[1::2], argv[2::2]) if flag.startswith("--")}


class ToyOptions(Spec):
    """The toy engine's options block (`pools.<pool>.toy`)."""

    context_tokens: int = Field(ge=16)
    slots: int = Field(default=2, ge=1)
    extra_args: list[str] = Field(default_factory=list)


class ToyEngine(Engine):
    """A server the project has never heard of: one process per instance, on one node."""

    name: ClassVar[str] = "toyserve"
    title: ClassVar[str] = "ToyServe"
    server_role: ClassVar[str] = "toyserve"
    multi_gpu: ClassVar[tuple[str, ...]] = ("tensor",)
    multi_node: ClassVar[MultiNode] = "none"
    metrics_job: ClassVar[str] = "toyserve"
    http_server: ClassVar[EngineServer] = EngineServer(
        keepalive_seconds=20,
        keepalive_env="TOY_KEEP_ALIVE",
        not_ready_statuses=(503, 529),
        sourced=unverified("the toy server of this test"),
    )
    memory_keys: ClassVar[str] = "toy.slots"
    offline_vars: ClassVar[dict[str, str]] = {"TOY_OFFLINE": "1"}
    options_key: ClassVar[str] = "toy"
    options_model: ClassVar[type[Spec]] = ToyOptions
    required_option: ClassVar[str] = "contextTokens"
    context_key: ClassVar[str] = "contextTokens"
    default_image: ClassVar[str] = TOY_IMAGE
    typed_flags: ClassVar[dict[str, str]] = {"--slots": "pools.<pool>.toy.slots"}
    launch_rules: ClassVar[tuple[LaunchRule, ...]] = (
        LaunchRule(
            "hardware",
            "toy-slots",
            "A toy server keeps to its slots.",
            toy_slots_rule,
            config={"maxSlots": {"type": "integer", "default": 4}},
        ),
    )

    def model_server_launch(self, props: Mapping[str, Any]) -> ToyLaunch | None:
        options = toy_options([str(t) for t in props.get("argv") or []])
        gpu = str(props.get("gpuModel"))
        return ToyLaunch(int(options.get("slots", 1)), gpu, GPUS.get(gpu))

    def container_server(self, props: Mapping[str, Any], image: str | None) -> ServerCall | None:
        argv = [str(t) for t in props.get("command") or []]
        return ServerCall("toyserve", toy_options(argv)) if argv[:1] == ["toyserve"] else None

    def context_length(self, spec: StackSpec, pool: str) -> int:
        return spec.pools[pool].toy.context_tokens

    def serve_argv(self, spec: StackSpec, instance: Instance) -> list[str]:
        o = spec.pools[instance.pool].toy
        host = spec.node(instance.head).address
        return ["toyserve", "--host", host, "--port", str(instance.port), "--slots", str(o.slots), *o.extra_args]

    def serve_env(self, spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
        return {**offline_env(spec, instance.pool, self.offline_vars), **spec.pools[instance.pool].env}

    def capacity(self, spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
        return {"error": "capacity not estimated: ToyServe has no capacity model"}


@pytest.fixture
def toy_registered() -> Iterator[None]:
    # Every table register() writes, restored in place: other modules hold these very objects.
    tables: list[dict[str, Any] | list[str]] = [
        registry.ENGINES,
        registry.DEFAULT_IMAGES,
        registry.SECRET_FLAGS,
        registry.SECRET_FLAG_NAMES,
        registry.TYPED_ENV,
        spec_engines.DEPLOYED,
        spec_engines.DEPLOYED_KEYS,
        spec_engines.DEFAULT_ENGINE,
    ]
    saved = [copy.copy(t) for t in tables]
    registry.register(ToyEngine())
    yield
    for table, before in zip(tables, saved, strict=True):
        table.clear()
        if isinstance(table, list):
            table.extend(before)
        else:
            table.update(before)  # type: ignore[call-overload]


def test_the_toy_leaves_every_registry_table_as_it_found_it() -> None:
    before = {
        t: copy.copy(getattr(registry, t))
        for t in ("ENGINES", "DEFAULT_IMAGES", "SECRET_FLAGS", "SECRET_FLAG_NAMES", "TYPED_ENV")
    }
    spec_before = {t: copy.copy(getattr(spec_engines, t)) for t in ("DEPLOYED", "DEPLOYED_KEYS", "DEFAULT_ENGINE")}
    fixture = toy_registered.__wrapped__()  # type: ignore[attr-defined]
    next(fixture)
    assert "toyserve" in registry.ENGINES and set(ToyEngine.offline_vars) <= set(registry.TYPED_ENV)
    next(fixture, None)
    assert {t: getattr(registry, t) for t in before} == before
    assert {t: getattr(spec_engines, t) for t in spec_before} == spec_before


def toy_config(**toy: Any) -> dict[str, Any]:
    """The reference stack with its chat pool on the toy engine (its default image)."""
    return engine_config(engine="toyserve", image=None, toy={"contextTokens": 4096, **toy})


def test_a_registered_engine_is_a_stack_value_with_its_own_options_block(toy_registered: None) -> None:
    spec = load_stack_config(toy_config(slots=3), set())
    chat = spec.pools["chat"]
    assert (chat.engine, chat.image, chat.toy.slots, chat.vllm) == ("toyserve", TOY_IMAGE, 3, None)


def test_its_options_are_validated_under_its_key_and_its_typed_flags_refused_in_extra_args(
    toy_registered: None,
) -> None:
    with pytest.raises(SpecError) as bad:
        load_stack_config(toy_config(slots=0), set())
    assert [str(i) for i in bad.value.issues] == ["pools.chat.toy.slots: 0 is not allowed: must be at least 1"]
    with pytest.raises(SpecError) as bad:
        load_stack_config(toy_config(extraArgs=["--slots=9"]), set())
    assert [str(i) for i in bad.value.issues] == [
        "pools.chat.toy.extraArgs[0]: '--slots=9' is set by the typed key pools.chat.toy.slots: state it there instead"
    ]


def test_a_stack_on_the_toy_engine_plans_containers_gateway_monitoring_and_policies(toy_registered: None) -> None:
    run: ProgramRun = run_stack(toy_config())
    [server] = [r for r in run.registrations if r.type == CONTAINER and r.name == "chat-gpu-03-toyserve"]
    assert server.inputs["command"] == ["toyserve", "--host", "192.168.10.13", "--port", "8000", "--slots", "2"]
    assert "TOY_OFFLINE=1" in server.inputs["envs"]
    labels = {x["label"]: x["value"] for x in server.inputs["labels"]}
    assert (labels["llm-cluster.engine"], labels["llm-cluster.image"]) == ("toyserve", TOY_IMAGE)
    assert "gpu-03-image-toyserve-1-0" in {r.name for r in run.registrations}
    # The gateway takes the toy server's own keep-alive and not-ready statuses.
    conf = written_files(run.get("gateway-config").plain_inputs()["create"])["/etc/llm-cluster/gateway/conf/nginx.conf"]
    upstream = conf[conf.index("upstream llm_pool_chat {") :]
    assert upstream[: upstream.index("\n    }")].splitlines()[-2:] == [
        "        keepalive 32;",
        "        keepalive_timeout 18s;",
    ]
    assert "http_503 http_504 http_529 non_idempotent;" in conf
    # Prometheus scrapes its servers under the engine's own job.
    prometheus = yaml.safe_load(
        written_files(run.get("monitoring-prometheus-config").plain_inputs()["create"])[
            "/etc/llm-cluster/monitoring/prometheus/prometheus.yml"
        ]
    )
    [toy_job] = [job for job in prometheus["scrape_configs"] if job["job_name"] == "toyserve"]
    assert [t["labels"]["instance"] for t in toy_job["static_configs"]] == [f"chat-gpu-0{i}" for i in (3, 4, 5, 6)]
    # The pack judges it by the rules every engine gets, with no rule written for it: its image is not in a
    # facts table (advisory) and, with no capacity model, memory fit cannot be judged (refused).
    violations = analyze(run.registrations)
    verdicts = {(v.policy_name, v.enforcement_level) for v in violations if "chat-gpu-03" in v.resource_name}
    assert verdicts == {("engine-image-unknown", "advisory"), ("engine-capacity", "mandatory")}
    messages = [v.message for v in violations if v.policy_name.startswith("engine-")]
    assert any("image example.org/toyserve:1.0 is not in the toyserve facts table" in m for m in messages)
    assert any("capacity not estimated: ToyServe has no capacity model" in m for m in messages)


def test_unregistered_the_engine_is_an_unknown_value_again() -> None:
    with pytest.raises(SpecError) as bad:
        load_stack_config(toy_config(), set())
    assert str(bad.value.issues[0]).startswith("pools.chat.engine: 'toyserve' is not allowed: must be one of 'vllm'")


def test_its_launch_rules_join_the_pack_under_their_topic_and_judge_its_servers(toy_registered: None) -> None:
    hardware = launch_policies("hardware")
    assert [p.name for p in hardware][-2:] == ["vllm-gpu-unknown", "toy-slots"]  # in registry order
    run: ProgramRun = run_stack(toy_config(slots=6))
    violations = analyze(run.registrations, policies=hardware)
    assert {v.policy_name for v in violations} == {"toy-slots"}
    assert [v.message.split("\n")[-1] for v in violations] == [
        "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06): --slots 6 exceeds maxSlots 4. "
        "Stack key to edit: pools.chat.toy.slots (--slots)."
    ]
    assert analyze(run.registrations, {"toy-slots": {"maxSlots": 8}}, policies=hardware) == []


def test_a_raw_container_running_its_server_is_read_by_its_own_parser(toy_registered: None) -> None:
    props = {"networkMode": "host", "command": ["toyserve", "--port", "8000", "--host", "0.0.0.0"]}
    [finding] = exposure_found(RawContainer(CONTAINER, props), {"publicRoles": ["gateway"]})
    assert finding.startswith("toyserve --host 0.0.0.0 on the host network listens on every interface")


@dataclass
class RawContainer:
    """A container added outside the components, as the stack policies see it."""

    resource_type: str
    props: dict[str, Any]
    urn: str = "urn:pulumi:t::p::docker:index/container:Container::raw"
    name: str = "raw"
    opts: Any = None
