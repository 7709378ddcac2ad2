"""Rules reported once per pool (policies/rules/grouped.py) as tables through the analyzer's AnalyzeStack: which
pool and instance a resource belongs to (its labels, else its nearest parent component), the stack keys of the
pool's first flagged instance, which resources a finding holds for when not all, findings that share their
advice said once, resources of no pool on their own URN, and values unknown at preview left for `pulumi up`."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel, PolicyConfigSchema, PolicyResource, StackValidationArgs
from pulumi_policy.proxy import UnknownValueError

from plan.analyze import configured_servicer
from policies.rules.grouped import pool_rule
from tests.support.policies import STACK

CONTAINER = "docker:index/container:Container"
MODEL_SERVER = "llm-cluster:vllm:ModelServer"
RAY_CLUSTER = "llm-cluster:ray:RayCluster"
COMMAND = "command:remote:Command"
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's sentinel for an output unknown at preview


def resource(type_: str, name: str, props: dict[str, Any], parent: str | None = None) -> proto.AnalyzerResource:
    s = struct_pb2.Struct()
    s.update(props)
    chain = f"{parent.split('::')[2]}${type_}" if parent else type_
    return proto.AnalyzerResource(
        urn=f"{STACK}{chain}::{name}",
        type=type_,
        name=name,
        properties=s,
        parent=parent or "",
        options=proto.AnalyzerResourceOptions(deleteBeforeReplace=True, deleteBeforeReplaceDefined=True),
    )


def urn(type_: str, name: str) -> str:
    return f"{STACK}{type_}::{name}"


def stack(rule: str, *resources: proto.AnalyzerResource) -> list[tuple[str, str]]:
    """(message without the description, urn) of one stack rule over these resources."""
    got = configured_servicer(None).AnalyzeStack(proto.AnalyzeStackRequest(resources=list(resources)), None)
    return [(d.message.split("\n", 1)[1], d.urn) for d in got.diagnostics if d.policyName == rule]


def labels(**values: str) -> list[dict[str, str]]:
    return [{"label": f"llm-cluster.{k}", "value": v} for k, v in values.items()]


def stays_down(what: str) -> str:
    return (
        f'restart is no: {what} stays down after it exits and after a reboot of the node. Set restart="unless-stopped".'
    )


def down(name: str, **label_values: str) -> dict[str, Any]:
    return {"name": name, "image": "nginx:1.27", "restart": "no", "labels": labels(**label_values)}


def server(pool: str, instance: str, keys: dict[str, str] | None = None) -> dict[str, Any]:
    return {"pool": pool, "instance": instance, "stackKeys": keys or {}}


def test_a_resource_of_no_pool_reports_on_its_own_urn() -> None:
    assert stack("container-restart", resource(CONTAINER, "nginx", down("nginx"))) == [
        (stays_down("the container"), urn(CONTAINER, "nginx"))
    ]
    assert stack("container-restart", resource(CONTAINER, "ok", {**down("ok"), "restart": "always"})) == []


def test_a_pool_by_its_labels_once_naming_its_instances_on_its_first_resource() -> None:
    got = stack(
        "container-restart",
        resource(CONTAINER, "chat-gpu-04-vllm", down("x", pool="chat", instance="chat-gpu-04", role="vllm")),
        resource(CONTAINER, "chat-gpu-03-vllm", down("x", pool="chat", instance="chat-gpu-03", role="vllm")),
        # No instance label: the resource's name stands for it.
        resource(CONTAINER, "chat-extra", down("x", pool="chat", role="vllm")),
        resource(CONTAINER, "code-gpu-01-vllm", down("x", pool="code", instance="code-gpu-01", role="vllm")),
    )
    assert got == [
        (
            f"pools.chat, 3 instances (chat-extra, chat-gpu-03, chat-gpu-04): {stays_down('vllm')}",
            urn(CONTAINER, "chat-extra"),
        ),
        (f"pools.code, instance code-gpu-01: {stays_down('vllm')}", urn(CONTAINER, "code-gpu-01-vllm")),
    ]


def test_a_pool_by_the_nearest_parent_component_that_names_it() -> None:
    head = urn(RAY_CLUSTER, "chat-ray")
    ms = urn(MODEL_SERVER, "ms-03")
    part = f"{STACK}{MODEL_SERVER}$llm-cluster:x:Part::part"
    got = stack(
        "container-restart",
        resource(RAY_CLUSTER, "chat-ray", {"pool": "chat"}),
        # The ModelServer's instance, not its resource name.
        resource(MODEL_SERVER, "ms-03", {"pool": "chat", "instance": "chat-gpu-03"}),
        resource(MODEL_SERVER, "orphan", {"instance": "orphan"}),
        resource("llm-cluster:x:Part", "part", {}, ms),
        # The RayCluster names no instance: its name stands for it.
        resource(CONTAINER, "head", down("head", role="ray-head"), head),
        resource(CONTAINER, "srv", down("srv"), ms),
        # Two levels down: the nearest parent that names a pool.
        resource(CONTAINER, "deep", down("deep"), part),
        # A parent that names no pool: the resource reports on its own.
        resource(CONTAINER, "lost", down("lost"), urn(MODEL_SERVER, "orphan")),
        # A remote command's labels (it has none in the provider) are not read.
        resource(COMMAND, "cmd", {"labels": labels(pool="chat"), "create": "export HF_TOKEN=hf_live_abcdef"}),
    )
    assert got == [
        (stays_down("the container"), f"{STACK}{MODEL_SERVER}${CONTAINER}::lost"),
        (
            "pools.chat, 2 instances (chat-gpu-03, chat-ray): in head: restart is no: ray-head stays down after it exits "
            "and after a reboot of the node; in deep, srv: restart is no: the container stays down after it exits and "
            'after a reboot of the node. Set restart="unless-stopped".',
            f"{STACK}{MODEL_SERVER}$llm-cluster:x:Part${CONTAINER}::deep",
        ),
    ]
    secrets = stack(
        "no-plaintext-secrets",
        resource(COMMAND, "cmd", {"labels": labels(pool="chat"), "create": "export HF_TOKEN=hf_live_abcdef"}),
    )
    assert [(m.split(":")[0], u) for m, u in secrets] == [("credential in plain text", urn(COMMAND, "cmd"))]


def test_a_finding_of_some_resources_names_them_and_shared_advice_is_said_once() -> None:
    ms = urn(MODEL_SERVER, "chat-gpu-03")
    keys = {"HF_TOKEN": "pools.chat.env.HF_TOKEN", "OPENAI_API_KEY": "pools.chat.env.OPENAI_API_KEY"}
    got = stack(
        "no-plaintext-secrets",
        resource(MODEL_SERVER, "chat-gpu-03", server("chat", "chat-gpu-03", keys)),
        resource(MODEL_SERVER, "chat-gpu-04", server("chat", "chat-gpu-04", {"HF_TOKEN": "wrong.key"})),
        # Only a ModelServer's stackKeys are the pool's.
        resource(RAY_CLUSTER, "ray", server("chat", "chat-gpu-03", {"HF_TOKEN": "wrong.key"})),
        resource(CONTAINER, "a", {"envs": ["HF_TOKEN=hf_live_abcdef"]}, ms),
        resource(CONTAINER, "b", {"envs": ["HF_TOKEN=hf_live_abcdef"]}, ms),
        resource(
            CONTAINER,
            "c",
            {"envs": ["HF_TOKEN=hf_live_abcdef", "OPENAI_API_KEY=sk-live-abcdef"]},
            urn(MODEL_SERVER, "chat-gpu-04"),
        ),
    )
    advice = (
        "Anyone with docker or shell access on the node reads it (docker inspect, ps, the command log). Read it "
        'from a file on the host (NAME__FILE, --api-key "$(cat /etc/llm-cluster/…)"), or list a harmless env '
        "name in this policy's ignoreEnv."
    )
    # The keys are those of the pool's first flagged instance (chat-gpu-03), not of the later one.
    assert got == [
        (
            "pools.chat, 2 instances (chat-gpu-03, chat-gpu-04): in a, b: credential in plain text: env HF_TOKEN; "
            f"in c: credential in plain text: env HF_TOKEN, env OPENAI_API_KEY. {advice} Stack keys to edit: "
            "pools.chat.env.HF_TOKEN (HF_TOKEN), pools.chat.env.OPENAI_API_KEY (OPENAI_API_KEY).",
            f"{STACK}{MODEL_SERVER}${CONTAINER}::a",
        )
    ]


def test_findings_with_their_own_advice_each_keep_it() -> None:
    got = stack(
        "container-restart",
        resource(CONTAINER, "a", down("a", pool="chat", instance="chat-gpu-03", role="vllm")),
        resource(
            CONTAINER, "b", {**down("b", pool="chat", instance="chat-gpu-03", role="vllm"), "restart": "on-failure"}
        ),
    )
    assert got == [
        (
            "pools.chat, instance chat-gpu-03: in a: restart is no: vllm stays down after it exits and after a reboot "
            "of the node; in b: restart is on-failure: vllm stays down after a clean exit or a reboot of the node "
            '(on-failure restarts only after a non-zero exit). Set restart="unless-stopped".',
            urn(CONTAINER, "a"),
        )
    ]


@pytest.mark.parametrize("unknown_in", ["envs", "labels"])
def test_a_value_unknown_at_preview_is_judged_at_up(unknown_in: str) -> None:
    props = {"envs": ["HF_TOKEN=hf_live_abcdef"], "labels": labels(pool="chat"), unknown_in: UNKNOWN}
    got = stack(
        "no-plaintext-secrets",
        resource(CONTAINER, "x", props),
        resource(CONTAINER, "y", {"envs": ["HF_TOKEN=hf_live_abcdef"]}),
    )
    assert [u for _, u in got] == [urn(CONTAINER, "y")]


def test_remote_commands_of_a_pool_by_their_parent() -> None:
    ms = urn(MODEL_SERVER, "chat-gpu-03")
    got = stack(
        "no-plaintext-secrets",
        resource(MODEL_SERVER, "chat-gpu-03", server("chat", "chat-gpu-03")),
        resource(COMMAND, "setup", {"create": "export HF_TOKEN=hf_live_abcdef"}, ms),
    )
    assert [(m.split(":")[0], u) for m, u in got] == [
        ("pools.chat, instance chat-gpu-03", f"{STACK}{MODEL_SERVER}${COMMAND}::setup")
    ]


# --- a rule built now (the pack's rules are built when it is imported) ------------------------------------


def policy_resource(type_: str, name: str, props: Any, parent: PolicyResource | None = None) -> PolicyResource:
    return PolicyResource(type_, props, urn(type_, name), name, None, None, parent, [], {})  # type: ignore[arg-type]


class UnknownLabels(dict):  # type: ignore[type-arg]
    """Props whose labels are unknown at preview."""

    def get(self, key: str, default: Any = None) -> Any:
        if key == "labels":
            raise UnknownValueError(UNKNOWN, ["labels"])
        return super().get(key, default)


def toy_findings(resource: Any, config: dict[str, Any]) -> list[str]:
    if resource.props.get("unknown"):
        raise UnknownValueError(UNKNOWN, ["unknown"])
    # A finding ending in ! has no advice after it.
    return [f if f.endswith("!") else f"{f}. Fix it at {config['level']}" for f in resource.props.get("findings") or []]


def test_a_pool_rule_built_now_groups_reports_and_skips_the_unknown() -> None:
    schema = PolicyConfigSchema(properties={"level": {"type": "number", "default": 3}})
    rule = pool_rule("toy-pool", "A toy rule.", toy_findings, level=EnforcementLevel.ADVISORY, config=schema)
    assert (rule.name, rule.description, rule.enforcement_level, rule.config_schema) == (
        "toy-pool",
        "A toy rule.",
        EnforcementLevel.ADVISORY,
        schema,
    )
    ms3 = policy_resource(MODEL_SERVER, "chat-gpu-03", server("chat", "chat-gpu-03", {"--x": "pools.chat.x"}))
    ms4 = policy_resource(MODEL_SERVER, "chat-gpu-04", server("chat", "chat-gpu-04", {"--x": "wrong"}))
    resources = [
        ms4,
        ms3,
        # Values unknown at preview: skipped, and the resources after them still judged.
        policy_resource(CONTAINER, "u", {"findings": ["set --x"], "unknown": True}, ms3),
        policy_resource(CONTAINER, "v", UnknownLabels(findings=["set --x"])),
        policy_resource(CONTAINER, "a", {"findings": ["set --x"]}, ms3),
        policy_resource(CONTAINER, "b", {"findings": ["set --x"]}, ms4),
        policy_resource(CONTAINER, "c", {"findings": ["set --x"], "labels": labels(pool="code", instance="code-1")}),
        policy_resource(CONTAINER, "lone", {"findings": ["one", "two"]}),
        policy_resource(CONTAINER, "clean", {}, ms3),
        # A finding without advice, beside those with: each part said, one after the other.
        policy_resource(CONTAINER, "d", {"findings": ["bare!"], "labels": labels(pool="code", instance="code-1")}),
    ]
    for config, level in ((None, 3), ({"level": 5}, 5)):
        reports: list[tuple[str, str | None]] = []
        rule.validate(StackValidationArgs(resources, config), lambda m, u, out=reports: out.append((m, u)))
        assert reports == [
            (f"one. Fix it at {level}", urn(CONTAINER, "lone")),
            (f"two. Fix it at {level}", urn(CONTAINER, "lone")),
            (
                f"pools.chat, 2 instances (chat-gpu-03, chat-gpu-04): set --x. Fix it at {level}. Stack key to edit: "
                "pools.chat.x (--x).",
                urn(CONTAINER, "a"),
            ),
            (f"pools.code, instance code-1: in c: set --x. Fix it at {level} in d: bare!", urn(CONTAINER, "c")),
        ]
