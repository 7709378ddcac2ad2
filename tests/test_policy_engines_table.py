"""The engine rules as policies (policies/rules/engines.py) as tables: which engines each rule judges, the
reason it gives for any other resource, its level and description in the pack, one violation per message; and
a rule over an engine registered after the pack was built, read from the registry when it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pulumi_policy import EnforcementLevel

from components.engines.judged import COMMON_RULES, EngineRule
from components.engines.registry import ENGINES
from policies.rules.engines import POLICIES, engine_policy, policies
from tests.support.policies import not_applicable

MODEL_SERVER = "llm-cluster:vllm:ModelServer"
COMMON = [rule.name for rule in COMMON_RULES]
OWN = {engine.name: [rule.name for rule in engine.policy_rules] for engine in ENGINES.values()}


def test_the_pack_lists_the_common_rules_then_each_engines_own_in_registry_order() -> None:
    assert [p.name for p in POLICIES] == [*COMMON, *OWN["vllm"], *OWN["lmdeploy"], *OWN["llamacpp"]]
    assert OWN["vllm"] == [] and OWN["lmdeploy"][0] == "lmdeploy-model" and OWN["llamacpp"][0] == "llamacpp-kv-cache"
    described = {p.name: (p.description, p.enforcement_level) for p in POLICIES}
    # The common rules name the engines judged from their image table, by title.
    assert described["engine-image"] == (
        "The engine image has kernels for the pool's GPU (LMDeploy, llama.cpp).",
        EnforcementLevel.MANDATORY,
    )
    assert described["engine-image-unknown"] == (
        "The engine image is one the facts table knows (LMDeploy, llama.cpp).",
        EnforcementLevel.ADVISORY,
    )
    assert described["llamacpp-split-mode"] == (
        "Split modes other than layer/none are not shown to work on V100.",
        EnforcementLevel.ADVISORY,
    )
    assert described["lmdeploy-model"][1] == EnforcementLevel.MANDATORY


@pytest.mark.parametrize(
    ("type_", "props", "common", "lmdeploy", "llamacpp"),
    [
        # Not a ModelServer, whatever its props say.
        (
            "docker:index/container:Container",
            {"engine": "lmdeploy"},
            "not a lmdeploy or llamacpp server",
            "not a lmdeploy server",
            "not a llamacpp server",
        ),
        # A vLLM server is judged by vLLM's own launch rules, not these; an engine no longer registered by none.
        (
            MODEL_SERVER,
            {"engine": "vllm"},
            "not a lmdeploy or llamacpp server",
            "not a lmdeploy server",
            "not a llamacpp server",
        ),
        (
            MODEL_SERVER,
            {"engine": "tgi"},
            "not a lmdeploy or llamacpp server",
            "not a lmdeploy server",
            "not a llamacpp server",
        ),
        # Each engine's own rules judge its servers only; a GPU the facts do not know is said.
        (
            MODEL_SERVER,
            {"engine": "lmdeploy", "gpuModel": "Quadro Z"},
            "GPU model 'Quadro Z' is not in the facts table",
            "GPU model 'Quadro Z' is not in the facts table",
            "not a llamacpp server",
        ),
        (
            MODEL_SERVER,
            {"engine": "llamacpp"},
            "GPU model None is not in the facts table",
            "not a lmdeploy server",
            "GPU model None is not in the facts table",
        ),
    ],
)
def test_each_rule_says_why_it_does_not_judge_a_resource(
    type_: str, props: dict[str, Any], common: str, lmdeploy: str, llamacpp: str
) -> None:
    reasons = not_applicable(type_, props)
    expected = {
        **dict.fromkeys(COMMON, common),
        **dict.fromkeys(OWN["lmdeploy"], lmdeploy),
        **dict.fromkeys(OWN["llamacpp"], llamacpp),
    }
    assert {name: reasons.get(name) for name in expected} == expected


@dataclass
class Args:
    """What a resource validation reads of its resource; not_applicable raises, as pulumi_policy's does."""

    resource_type: str
    props: dict[str, Any]
    reports: list[tuple[str, str | None]] = field(default_factory=list)

    def not_applicable(self, reason: str | None = None) -> None:
        raise LookupError(reason)


class Toy:
    """An engine registered after the pack was built."""

    name = "toy"
    title = "Toy"
    common_rules = True
    policy_rules: tuple[EngineRule, ...] = ()

    def image_facts_of(self, ref: str) -> None:
        return None


def test_a_rule_reports_each_message_and_reads_the_registry_when_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    def check(server: Any) -> list[str]:
        seen.append((server.engine.name, server.gpu.name))
        return ["first", "second"]

    policy = engine_policy(EngineRule("toy-rule", "d", check, advisory=True), lambda e: e.name == "toy", "Toy's rule.")
    assert (policy.name, policy.description, policy.enforcement_level) == (
        "toy-rule",
        "Toy's rule.",
        EnforcementLevel.ADVISORY,
    )
    props = {"engine": "toy", "gpuModel": "Tesla T4", "image": "toy:1"}
    with pytest.raises(LookupError, match="^not a  server$"):
        policy.validate(Args(MODEL_SERVER, props), lambda m, u: None)
    monkeypatch.setitem(ENGINES, "toy", Toy())
    args = Args(MODEL_SERVER, props)
    policy.validate(args, lambda message, urn: args.reports.append((message, urn)))
    assert (args.reports, seen) == ([("first", None), ("second", None)], [("toy", "Tesla T4")])
    # The common rules' description names the engines judged from their image table when the pack is built.
    assert [p.description for p in policies()][0] == (
        "The engine image has kernels for the pool's GPU (LMDeploy, llama.cpp, Toy)."
    )
    with pytest.raises(LookupError, match="^not a lmdeploy or llamacpp or toy server$"):
        policies()[0].validate(Args(MODEL_SERVER, {"engine": "vllm"}), lambda m, u: None)


def test_the_rules_built_when_the_pack_is_built_judge_as_the_table_above() -> None:
    # (The pack's POLICIES were built at import; these are built now, from the same registry.)
    built = {p.name: p for p in policies()}

    def reason(name: str, type_: str, **props: Any) -> str:
        with pytest.raises(LookupError) as raised:
            built[name].validate(Args(type_, props), lambda m, u: None)
        return str(raised.value)

    assert (
        reason("engine-image", "docker:index/container:Container", engine="lmdeploy")
        == "not a lmdeploy or llamacpp server"
    )
    assert reason("engine-image", MODEL_SERVER, engine="vllm") == "not a lmdeploy or llamacpp server"
    assert reason("lmdeploy-model", "docker:index/container:Container", engine="lmdeploy") == "not a lmdeploy server"
    assert reason("lmdeploy-model", MODEL_SERVER, engine="llamacpp") == "not a lmdeploy server"
    assert reason("llamacpp-kv-cache", MODEL_SERVER, engine="lmdeploy") == "not a llamacpp server"
    assert reason("lmdeploy-model", MODEL_SERVER, engine="lmdeploy", gpuModel="Quadro Z") == (
        "GPU model 'Quadro Z' is not in the facts table"
    )
    assert reason("engine-flags", MODEL_SERVER, engine="llamacpp", gpuModel="Quadro Z") == (
        "GPU model 'Quadro Z' is not in the facts table"
    )
    levels = {name: p.enforcement_level for name, p in built.items()}
    assert (levels["engine-image"], levels["engine-image-unknown"], levels["lmdeploy-model"]) == (
        EnforcementLevel.MANDATORY,
        EnforcementLevel.ADVISORY,
        EnforcementLevel.MANDATORY,
    )
    mandatory = engine_policy(EngineRule("toy-rule", "d", lambda s: []), lambda e: True, "d")
    assert mandatory.enforcement_level == EnforcementLevel.MANDATORY
