"""The policy pack's rules that refuse what dies, as tables through the real analyzer servicer: each on both
sides of what it checks, with its whole message (policies/rules/*)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.policies import analyze, model_server, not_applicable, only, server


def gate_message(pool: str, gpu: str) -> str:
    return (
        f"pools.{pool}.qualificationGate is false: its servers start without the qualification gate, so an image "
        f"that cannot run on the {gpu} is found only when a server dies after loading its weights, minutes later "
        f"and in its log, instead of before anything loads. Remove pools.{pool}.qualificationGate (it defaults to "
        "true); only a rehearsal on hardware the gate cannot pass (CPU engines) lowers this rule, in its policy "
        "config."
    )


@pytest.mark.parametrize(
    ("changes", "refused"),
    [
        ({"qualificationGate": False}, ("chat", "Tesla V100-SXM2-32GB")),
        ({"qualificationGate": False, "pool": "code", "gpuModel": "Tesla T4"}, ("code", "Tesla T4")),
        # Unset or null is the default, the gate on.
        ({}, None),
        ({"qualificationGate": None}, None),
        ({"qualificationGate": True}, None),
    ],
)
def test_qualification_gate(changes: dict[str, Any], refused: tuple[str, str] | None) -> None:
    got = [d for d in model_server(server(**changes)) if d[0] == "qualification-gate"]
    assert got == (only("qualification-gate", gate_message(*refused)) if refused else [])


def test_qualification_gate_judges_model_servers_only() -> None:
    props = {"qualificationGate": False, "pool": "chat", "gpuModel": "Tesla V100-SXM2-32GB"}
    assert [d for d in analyze("docker:index/container:Container", "c", props) if d[0] == "qualification-gate"] == []


def test_qualification_gate_says_why_it_does_not_judge_a_container() -> None:
    reasons = not_applicable("docker:index/container:Container", {"qualificationGate": False})
    assert reasons["qualification-gate"] == "not a model server"
