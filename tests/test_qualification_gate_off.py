"""`pools.<pool>.qualificationGate: false`: a pool whose servers start without the gate (a rehearsal on CPU
engines) — planned without that pool's gates, printed by the plan, refused by the pack unless its config
lowers the rule."""

from __future__ import annotations

from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.planning.qualification import node_qualifications
from components.spec import SpecError
from plan.analyze import analyze
from plan.harness import ProgramRun
from plan.report import PlanResult, render_text

NS = "llm-cluster:"
MESSAGE = (
    "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06): pools.chat.qualificationGate is "
    "false: its servers start without the qualification gate, so an image that cannot run on the Tesla "
    "V100-SXM2-32GB is found only when a server dies after loading its weights, minutes later and in its log, "
    "instead of before anything loads. Remove pools.chat.qualificationGate (it defaults to true); only a rehearsal "
    "on hardware the gate cannot pass (CPU engines) lowers this rule, in its policy config."
)


def gate_verdicts(run: ProgramRun, policy_config: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    return [
        (v.enforcement_level, v.message.split("\n", 1)[1])
        for v in analyze(run.registrations, policy_config)
        if v.policy_name == "qualification-gate"
    ]


@pytest.fixture(scope="module")
def chat_ungated() -> ProgramRun:
    from tests.conftest import prod_config, run_stack

    config = prod_config()
    config[NS + "pools"]["chat"]["qualificationGate"] = False
    return run_stack(config)


def test_the_gate_is_on_unless_the_pool_says_otherwise(config: dict[str, Any]) -> None:
    spec = load_stack_config(config, set())
    assert [p.qualification_gate for p in spec.pools.values()] == [True, True]
    config[NS + "pools"]["chat"]["qualificationGate"] = "sometimes"
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    assert any("pools.chat.qualificationGate" in str(i) for i in err.value.issues)


def test_an_ungated_pools_nodes_get_no_gate_of_their_own(config: dict[str, Any]) -> None:
    config[NS + "pools"]["chat"]["qualificationGate"] = False
    gated = {(q.node, q.image) for q in node_qualifications(load_stack_config(config, set()))}
    # The chat pool alone uses gpu-03..06: only the reasoning pool's nodes keep their gates.
    assert gated == {("gpu-01", "vllm/vllm-openai:v0.19.1"), ("gpu-02", "vllm/vllm-openai:v0.19.1")}


def test_an_ungated_pools_servers_wait_for_no_gate(chat_ungated: ProgramRun) -> None:
    names = {r.name for r in chat_ungated.registrations}
    assert not [n for n in names if n.startswith(("gpu-03-qualify", "gpu-06-qualify"))]
    chat = chat_ungated.get("chat-gpu-03-vllm")
    assert not [d for d in chat.dependencies if "qualify" in d]
    # The other pool still waits for its gates.
    gate = chat_ungated.get("gpu-01-qualify-vllm-openai-v0-19-1-check")
    assert gate.urn in chat_ungated.get("reasoning-gpu-01-ray-head").dependencies


def test_the_pack_refuses_an_ungated_pool_unless_its_config_lowers_the_rule(
    chat_ungated: ProgramRun, prod_run: ProgramRun
) -> None:
    assert gate_verdicts(prod_run) == []
    assert gate_verdicts(chat_ungated) == [("mandatory", MESSAGE)]
    assert gate_verdicts(chat_ungated, {"qualification-gate": "advisory"}) == [("advisory", MESSAGE)]
    assert gate_verdicts(chat_ungated, {"qualification-gate": "disabled"}) == []


def test_the_plan_says_which_pool_starts_without_its_gate(config: dict[str, Any], chat_ungated: ProgramRun) -> None:
    config[NS + "pools"]["chat"]["qualificationGate"] = False
    spec = load_stack_config(config, set())
    text = render_text(
        PlanResult(stack="prod", config_path="Pulumi.prod.yaml", preview=False, spec=spec, run=chat_ungated)
    )
    assert [ln for ln in text.splitlines() if "qualification gate" in ln] == [
        "  chat         starts WITHOUT the qualification gate (pools.chat.qualificationGate: false; refused by "
        "the policy pack's qualification-gate unless its config lowers it)"
    ]
