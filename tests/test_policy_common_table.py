"""What every rule reads (policies/rules/common.py) as tables: a container's image ref and role, the words of its
scripts, whether it runs a Ray node, a URN's parent chain, a policy's config over its defaults, the stack keys a
message names, and the two wrappers every ModelServer rule runs in: once per pool (per_pool) and over every
launch of an engine (launch_policy), called as the analyzer calls them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pulumi_policy import EnforcementLevel, PolicyConfigSchema
from pulumi_policy.proxy import UnknownValueError

from components.engines.judged import LaunchRule
from components.engines.registry import ENGINES
from policies.rules.common import (
    config_with_defaults,
    container_image,
    is_ray_container,
    launch_policies,
    launch_policy,
    name_stack_keys,
    per_pool,
    pool_where,
    role_of,
    under_component,
    urn_types,
    words,
)
from tests.support.policies import STACK, server

CONTAINER = "docker:index/container:Container"
MODEL_SERVER = "llm-cluster:vllm:ModelServer"
RAY_CLUSTER = "llm-cluster:ray:RayCluster"


def label(name: str, value: str) -> dict[str, str]:
    return {"label": name, "value": value}


class Unknown(dict):  # type: ignore[type-arg]
    """Props whose `image` is an output unknown at preview (pulumi_policy raises on reading it)."""

    def get(self, key: str, default: Any = None) -> Any:
        if key == "image":
            raise UnknownValueError("04da6b54-80e4-46f7-96ec-b56ff0331ba9", ["image"])
        return super().get(key, default)


@pytest.mark.parametrize(
    ("props", "ref"),
    [
        (
            {"labels": [label("llm-cluster.image", "vllm/vllm-openai:v0.19.1")], "image": "sha256:0123"},
            "vllm/vllm-openai:v0.19.1",
        ),
        ({"labels": [label("llm-cluster.image", "a:1")], "image": "b:2"}, "a:1"),
        ({"labels": [label("llm-cluster.image", "")], "image": "b:2"}, "b:2"),
        ({"image": "nginx:1.27"}, "nginx:1.27"),
        ({"image": "sha256:0123"}, None),
        ({"image": ""}, None),
        ({"image": 7}, None),
        ({}, None),
        (Unknown(), None),
        (Unknown(labels=[label("llm-cluster.image", "a:1")]), "a:1"),
    ],
)
def test_container_image(props: dict[str, Any], ref: str | None) -> None:
    assert container_image(props) == ref


@pytest.mark.parametrize(
    ("argv", "out"),
    [
        (["vllm", "serve"], ["vllm", "serve"]),
        (["bash", "-c", "ray start --head"], ["bash", "-c", "ray start --head", "ray", "start", "--head"]),
        (["a\tb"], ["a\tb", "a", "b"]),
        (["a\nb # c"], ["a\nb # c", "a", "b"]),
        (["x 'y z'"], ["x 'y z'", "x", "y z"]),
        # Unbalanced quotes: the token as it is.
        (["x 'y"], ["x 'y"]),
        ([], []),
    ],
)
def test_words(argv: list[str], out: list[str]) -> None:
    assert words(argv) == out


@pytest.mark.parametrize(
    ("props", "role"),
    [
        ({"labels": [label("llm-cluster.role", "ray-head")], "image": "prom/prometheus:v2"}, "ray-head"),
        ({"labels": [label("llm-cluster.role", "")], "image": "prom/prometheus:v2"}, "prometheus"),
        ({"image": "quay.io/prometheus/node-exporter:v1.8.2"}, "node-exporter"),
        ({"image": "grafana/grafana-enterprise"}, "grafana"),
        ({"image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-ubuntu22.04"}, "dcgm-exporter"),
        ({"labels": [label("llm-cluster.image", "prom/alertmanager:v0.27.0")], "image": "sha256:0"}, "alertmanager"),
        ({"image": "nginx:1.27"}, ""),
        ({"image": "sha256:0"}, ""),
        ({}, ""),
    ],
)
def test_role_of(props: dict[str, Any], role: str) -> None:
    assert role_of(props) == role


@pytest.mark.parametrize(
    ("props", "ray"),
    [
        ({"labels": [label("llm-cluster.role", "ray-head")]}, True),
        ({"labels": [label("llm-cluster.role", "ray-worker")]}, True),
        ({"labels": [label("llm-cluster.role", "vllm")]}, False),
        ({"command": ["ray", "start", "--head"]}, True),
        ({"entrypoints": ["/usr/local/bin/ray"], "command": ["start", "--address=h:6379"]}, True),
        ({"command": ["ray", "status"]}, False),
        # The last two words of what it runs.
        ({"entrypoints": ["ray"], "command": ["start"]}, True),
        ({"command": ["exec", "ray", "start"]}, True),
        ({"command": ["xray", "start"]}, False),
        ({"command": ["start", "ray"]}, False),
        ({"command": ["ray"]}, False),
        ({}, False),
    ],
)
def test_is_ray_container(props: dict[str, Any], ray: bool) -> None:
    assert is_ray_container(props) is ray


@pytest.mark.parametrize(
    ("urn", "types", "under"),
    [
        (
            f"{STACK}llm-cluster:vllm:ModelServer${CONTAINER}::chat-gpu-03-vllm",
            ["llm-cluster:vllm:ModelServer", CONTAINER],
            True,
        ),
        (f"{STACK}pulumi:providers:docker${CONTAINER}::c", ["pulumi:providers:docker", CONTAINER], False),
        (f"{STACK}a$llm-cluster:x:Y$b::c", ["a", "llm-cluster:x:Y", "b"], True),
        (f"{STACK}{CONTAINER}::c", [CONTAINER], False),
        (f"{STACK}llm-cluster:vllm:ModelServer::chat", ["llm-cluster:vllm:ModelServer"], False),
        ("urn:pulumi:prod::llm-cluster", [], False),
        ("", [], False),
    ],
)
def test_urn_types_and_under_component(urn: str, types: list[str], under: bool) -> None:
    assert (urn_types(urn), under_component(urn)) == (types, under)


@dataclass
class Configured:
    config: dict[str, Any] | None

    def get_config(self) -> dict[str, Any] | None:
        return self.config


SCHEMA = PolicyConfigSchema(
    properties={"a": {"type": "number", "default": 4}, "b": {"type": "array", "default": []}, "c": {"type": "string"}}
)


@pytest.mark.parametrize(
    ("schema", "config", "out"),
    [
        (SCHEMA, None, {"a": 4, "b": []}),
        (SCHEMA, {}, {"a": 4, "b": []}),
        (SCHEMA, {"a": 2}, {"a": 2, "b": []}),
        (SCHEMA, {"c": "x", "b": ["y"]}, {"a": 4, "b": ["y"], "c": "x"}),
        (None, {"a": 1}, {"a": 1}),
        (None, None, {}),
    ],
)
def test_config_with_defaults(
    schema: PolicyConfigSchema | None, config: dict[str, Any] | None, out: dict[str, Any]
) -> None:
    assert config_with_defaults(Configured(config), schema) == out


KEYS = {
    "--max-model-len": "pools.chat.vllm.maxModelLen",
    "--tensor-parallel-size": "pools.chat.tensorParallel",
    "--enable-prefix-cache": "pools.chat.vllm.extraArgs[2] (given in extraArgs)",
    "*env": "pools.chat.env",
    "NCCL_IB_HCA": "nodes.gpu-03.hca.device",
    "OPENAI_API_KEY": "pools.chat.env.OPENAI_API_KEY",
    "image vllm/vllm-openai:latest": "pools.chat.image",
}


@pytest.mark.parametrize(
    ("message", "keys", "out"),
    [
        ("no flag here.", KEYS, "no flag here."),
        (
            "lower --max-model-len",
            KEYS,
            "lower --max-model-len. Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len).",
        ),
        # Said at the end of a sentence or not, with trailing space: one full stop.
        (
            "lower --max-model-len.  ",
            KEYS,
            "lower --max-model-len. Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len).",
        ),
        (
            "lower it (--max-model-len)",
            KEYS,
            "lower it (--max-model-len) Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len).",
        ),
        (
            "lower --max-model-len!",
            KEYS,
            "lower --max-model-len! Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len).",
        ),
        (
            "lower --max-model-len?",
            KEYS,
            "lower --max-model-len? Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len).",
        ),
        # A short flag, by the long flag it stands for; a flag no key sets, left alone.
        ("-tp 16 spans nodes", KEYS, "-tp 16 spans nodes. Stack key to edit: pools.chat.tensorParallel (-tp)."),
        ("--seed is fine", KEYS, "--seed is fine"),
        # Part of a longer flag or word: not that flag.
        ("--max-model-len-x and x--max-model-len", KEYS, "--max-model-len-x and x--max-model-len"),
        # Without its dashes, as the planner writes it; with them it is the flag, named once.
        (
            "lower max-model-len to 8",
            KEYS,
            "lower max-model-len to 8. Stack key to edit: pools.chat.vllm.maxModelLen (max-model-len).",
        ),
        (
            "lower --max-model-len or max-model-len",
            KEYS,
            "lower --max-model-len or max-model-len. Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len).",
        ),
        ("set tensor-parallel", KEYS, "set tensor-parallel"),
        # A variable: its own key, else the pool's env, else nothing.
        ("fix NCCL_IB_HCA", KEYS, "fix NCCL_IB_HCA. Stack key to edit: nodes.gpu-03.hca.device (NCCL_IB_HCA)."),
        (
            "set VLLM_MLA_DISABLE=1",
            KEYS,
            "set VLLM_MLA_DISABLE=1. Stack key to edit: pools.chat.env.VLLM_MLA_DISABLE (VLLM_MLA_DISABLE).",
        ),
        ("set VLLM_MLA_DISABLE=1", {"--max-model-len": "k"}, "set VLLM_MLA_DISABLE=1"),
        # Every prefix of the variables of what the engines run on, by the pool's env.
        *[
            (f"set {name}=1", KEYS, f"set {name}=1. Stack key to edit: pools.chat.env.{name} ({name}).")
            for name in (
                "NCCL_DEBUG",
                "GLOO_SOCKET_IFNAME",
                "HF_HOME",
                "CUDA_VISIBLE_DEVICES",
                "TORCH_CUDA_ARCH_LIST",
                "PYTORCH_CUDA_ALLOC_CONF",
                "RAY_DEDUP_LOGS",
            )
        ],
        ("set X.NCCL_DEBUG and MY_VAR", KEYS, "set X.NCCL_DEBUG and MY_VAR"),
        (
            "env OPENAI_API_KEY is plain",
            KEYS,
            "env OPENAI_API_KEY is plain. Stack key to edit: pools.chat.env.OPENAI_API_KEY (OPENAI_API_KEY).",
        ),
        # A phrase a key stands for; a key ending in its own parenthesis takes the token inside it.
        (
            "image vllm/vllm-openai:latest moves",
            KEYS,
            "image vllm/vllm-openai:latest moves. Stack key to edit: pools.chat.image (image).",
        ),
        (
            "unrecognized flag --enable-prefix-cache",
            KEYS,
            "unrecognized flag --enable-prefix-cache. Stack key to edit: pools.chat.vllm.extraArgs[2] (given in extraArgs: --enable-prefix-cache).",
        ),
        # A key with its own words after it: the key itself is what the message may already name.
        (
            "drop pools.chat.vllm.extraArgs[2]: --enable-prefix-cache",
            KEYS,
            "drop pools.chat.vllm.extraArgs[2]: --enable-prefix-cache",
        ),
        # A phrase said twice: where it is first said.
        (
            "image vllm/vllm-openai:latest, -tp, image vllm/vllm-openai:latest",
            KEYS,
            "image vllm/vllm-openai:latest, -tp, image vllm/vllm-openai:latest. Stack keys to edit: pools.chat.image (image), "
            "pools.chat.tensorParallel (-tp).",
        ),
        # A key the message names already, or named twice: once, in the order the message says them.
        (
            "raise pools.chat.vllm.maxModelLen (--max-model-len)",
            KEYS,
            "raise pools.chat.vllm.maxModelLen (--max-model-len)",
        ),
        (
            "fix NCCL_IB_HCA, -tp and --max-model-len, then --max-model-len again",
            KEYS,
            "fix NCCL_IB_HCA, -tp and --max-model-len, then --max-model-len again. Stack keys to edit: "
            "nodes.gpu-03.hca.device (NCCL_IB_HCA), pools.chat.tensorParallel (-tp), pools.chat.vllm.maxModelLen (--max-model-len).",
        ),
        (
            "--tensor-parallel-size and -tp",
            KEYS,
            "--tensor-parallel-size and -tp. Stack key to edit: pools.chat.tensorParallel (--tensor-parallel-size).",
        ),
    ],
)
def test_name_stack_keys(message: str, keys: dict[str, str], out: str) -> None:
    assert name_stack_keys(message, keys) == out


def test_pool_where() -> None:
    assert pool_where("chat", ["chat-gpu-03"]) == "pools.chat, instance chat-gpu-03"
    assert pool_where("chat", ["a", "b"]) == "pools.chat, 2 instances (a, b)"


@dataclass
class Args:
    """What a resource validation reads of its resource; not_applicable raises, as pulumi_policy's does."""

    resource_type: str
    props: dict[str, Any]
    urn: str = f"{STACK}x::x"
    config: dict[str, Any] | None = None
    reports: list[tuple[str, str | None]] = field(default_factory=list)

    def not_applicable(self, reason: str | None = None) -> None:
        raise LookupError(reason)

    def get_config(self) -> dict[str, Any] | None:
        return self.config


def run(validate: Any, args: Args) -> list[tuple[str, str | None]]:
    validate(args, lambda message, urn=None: args.reports.append((message, urn)))
    return args.reports


def say(args: Any, report: Any) -> None:
    report("lower --max-model-len", "urn:x")
    report(f"second on {args.props.get('instance')}", None)


@pytest.mark.parametrize(
    ("type_", "props", "reports"),
    [
        # A pool's first instance reports for the pool, with the stack keys; its other instances not at all.
        (
            MODEL_SERVER,
            {
                "pool": "chat",
                "instance": "a",
                "poolInstances": ["a", "b"],
                "stackKeys": {"--max-model-len": "pools.chat.vllm.maxModelLen"},
            },
            [
                (
                    "pools.chat, 2 instances (a, b): lower --max-model-len. Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len).",
                    "urn:x",
                ),
                ("pools.chat, 2 instances (a, b): second on a", None),
            ],
        ),
        (
            MODEL_SERVER,
            {"pool": "chat", "instance": "a", "poolInstances": ["a"]},
            [("pools.chat, instance a: lower --max-model-len", "urn:x"), ("pools.chat, instance a: second on a", None)],
        ),
        # No pool, no instances, or not a ModelServer: reported as it is.
        (
            MODEL_SERVER,
            {"instance": "a", "poolInstances": ["a", "b"]},
            [("lower --max-model-len", "urn:x"), ("second on a", None)],
        ),
        (
            MODEL_SERVER,
            {"pool": "chat", "instance": "a", "poolInstances": []},
            [("lower --max-model-len", "urn:x"), ("second on a", None)],
        ),
        (
            CONTAINER,
            {"pool": "chat", "instance": "a", "poolInstances": ["a", "b"]},
            [("lower --max-model-len", "urn:x"), ("second on a", None)],
        ),
    ],
)
def test_per_pool(type_: str, props: dict[str, Any], reports: list[tuple[str, str | None]]) -> None:
    assert run(per_pool(say), Args(type_, props)) == reports


def test_per_pool_judges_a_pool_on_its_first_instance_only() -> None:
    props = {"pool": "chat", "instance": "b", "poolInstances": ["a", "b"]}
    with pytest.raises(LookupError, match=r"^reported once for pools\.chat, on its first instance a$"):
        run(per_pool(say), Args(MODEL_SERVER, props))


def checked(launch: Any, settings: Any) -> list[str]:
    return [f"{launch.gpu_name} at {settings.get('limit')}", ""]


def ray_image(image: str | None, settings: Any) -> str | None:
    return f"ray node on {image} at {settings.get('limit')}" if image != "ok:1" else None


RULE = LaunchRule("toy", "toy-launch", "A toy rule.", checked, config={"limit": {"type": "number", "default": 3}})
RAY_RULE = LaunchRule("toy", "toy-ray", "A toy Ray rule.", checked, advisory=True, ray_node_image=ray_image)
RAY_LABEL = {"labels": [label("llm-cluster.role", "ray-head")], "image": "rayproject/ray:2.40.0"}


@pytest.mark.parametrize(
    ("rule", "type_", "props", "urn", "config", "reports"),
    [
        # A vLLM ModelServer: each message of the check, empty ones dropped; the config's default or the user's.
        (RULE, MODEL_SERVER, server(), None, None, [("Tesla V100-SXM2-32GB at 3", None)]),
        (RULE, MODEL_SERVER, server(), None, {"limit": 5}, [("Tesla V100-SXM2-32GB at 5", None)]),
        # A Ray node's image, as the RayCluster states it or a raw Ray container's label says.
        (
            RAY_RULE,
            RAY_CLUSTER,
            {"image": "rayproject/ray:2.40.0"},
            None,
            None,
            [("ray node on rayproject/ray:2.40.0 at None", None)],
        ),
        (RAY_RULE, RAY_CLUSTER, {"image": "ok:1"}, None, None, []),
        (RAY_RULE, CONTAINER, RAY_LABEL, None, None, [("ray node on rayproject/ray:2.40.0 at None", None)]),
        (RAY_RULE, MODEL_SERVER, server(), None, None, [("Tesla V100-SXM2-32GB at None", None)]),
        # A Ray container's image by its label (its `image` is the pulled id); a RayCluster's as it states it.
        (
            RAY_RULE,
            CONTAINER,
            {**RAY_LABEL, "image": "sha256:0", "labels": [*RAY_LABEL["labels"], label("llm-cluster.image", "r:1")]},
            None,
            None,
            [("ray node on r:1 at None", None)],
        ),
        (
            RAY_RULE,
            RAY_CLUSTER,
            {"image": "r:2", "labels": [label("llm-cluster.image", "r:1")]},
            None,
            None,
            [("ray node on r:2 at None", None)],
        ),
        # A raw container that runs vLLM, by its argv or by its image's ENTRYPOINT, on the GPU its label names.
        (
            RULE,
            CONTAINER,
            {
                "entrypoints": ["vllm"],
                "command": ["serve", "/m"],
                "labels": [label("llm-cluster.gpu-model", "Tesla T4")],
            },
            None,
            None,
            [("Tesla T4 at 3", None)],
        ),
        (
            RULE,
            CONTAINER,
            {
                "command": ["/m"],
                "image": "sha256:0",
                "labels": [
                    label("llm-cluster.gpu-model", "Tesla T4"),
                    label("llm-cluster.image", "vllm/vllm-openai:v0.19.1"),
                ],
            },
            None,
            None,
            [("Tesla T4 at 3", None)],
        ),
    ],
)
def test_launch_policy_judges(
    rule: LaunchRule,
    type_: str,
    props: dict[str, Any],
    urn: str | None,
    config: dict[str, Any] | None,
    reports: list[tuple[str, str | None]],
) -> None:
    policy = launch_policy(ENGINES["vllm"], rule)
    args = Args(type_, props, urn or f"{STACK}{type_}::x", config)
    assert run(policy.validate, args) == reports


@pytest.mark.parametrize(
    ("rule", "type_", "props", "urn", "reason"),
    [
        (RULE, CONTAINER, RAY_LABEL, None, "not a vLLM server"),
        (RULE, RAY_CLUSTER, {"image": "rayproject/ray:2.40.0"}, None, "not a vLLM server"),
        (RULE, MODEL_SERVER, server(engine="lmdeploy"), None, "not a vLLM server"),
        (RULE, MODEL_SERVER, server(gpuModel="Quadro Z"), None, "GPU model 'Quadro Z' is not in the facts table"),
        # A Ray container of a component is judged on its RayCluster, not on its own.
        (RAY_RULE, CONTAINER, RAY_LABEL, f"{STACK}{RAY_CLUSTER}${CONTAINER}::head", "not a vLLM server"),
        (RAY_RULE, CONTAINER, {"image": "nginx:1.27"}, None, "not a vLLM server"),
        # A RayCluster whose props look like a vLLM container's: not a container, so no launch.
        (RULE, RAY_CLUSTER, {"entrypoints": ["vllm"], "command": ["serve", "/m"]}, None, "not a vLLM server"),
        # A vLLM container of a component: its ModelServer carries the launch.
        (
            RULE,
            CONTAINER,
            {
                "entrypoints": ["vllm"],
                "command": ["serve", "/m"],
                "labels": [label("llm-cluster.gpu-model", "Tesla T4")],
            },
            f"{STACK}{MODEL_SERVER}${CONTAINER}::c",
            "not a vLLM server",
        ),
    ],
)
def test_launch_policy_says_why_it_does_not_judge_a_resource(
    rule: LaunchRule, type_: str, props: dict[str, Any], urn: str | None, reason: str
) -> None:
    policy = launch_policy(ENGINES["vllm"], rule)
    with pytest.raises(LookupError, match=f"^{reason}$".replace("(", r"\(").replace(")", r"\)")):
        run(policy.validate, Args(type_, props, urn or f"{STACK}{type_}::x"))


def test_launch_policy_without_a_gpu_when_its_rule_needs_none() -> None:
    rule = LaunchRule("toy", "toy-any-gpu", "d", checked, needs_gpu=False)
    assert run(launch_policy(ENGINES["vllm"], rule).validate, Args(MODEL_SERVER, server(gpuModel="Quadro Z"))) == [
        ("Quadro Z at None", None)
    ]


def test_launch_policy_level_name_and_config() -> None:
    policy = launch_policy(ENGINES["vllm"], RULE)
    assert (policy.name, policy.description, policy.enforcement_level) == (
        "toy-launch",
        "A toy rule.",
        EnforcementLevel.MANDATORY,
    )
    assert policy.config_schema is not None and policy.config_schema.properties == {
        "limit": {"type": "number", "default": 3}
    }
    ray = launch_policy(ENGINES["vllm"], RAY_RULE)
    assert (ray.enforcement_level, ray.config_schema) == (EnforcementLevel.ADVISORY, None)


def test_launch_policies_list_every_engines_rules_of_a_topic_in_registry_order() -> None:
    names = [p.name for p in launch_policies("hardware")]
    expected = [r.name for e in ENGINES.values() for r in e.launch_rules if r.topic == "hardware"]
    assert names == expected and len(names) > 1
    with pytest.raises(LookupError, match="^not a vLLM server$"):
        run(launch_policies("hardware")[0].validate, Args(CONTAINER, {}))


class ToyEngine:
    """An engine whose reader takes any ModelServer's props for its launch."""

    name = "toy"
    title = "Toy"

    def model_server_launch(self, props: Any) -> Any:
        return type("ToyLaunch", (), {"gpu_name": "Tesla T4", "gpu": object()})()


def test_launch_policy_judges_only_its_engines_model_servers() -> None:
    policy = launch_policy(ToyEngine(), RULE)  # type: ignore[arg-type]
    with pytest.raises(LookupError, match="^not a Toy server$"):
        run(policy.validate, Args(MODEL_SERVER, server()))
    assert launch_policies("no-such-topic") == []
