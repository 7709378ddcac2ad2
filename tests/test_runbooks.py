"""The README's runbooks on the reference stack: the plan diff each step produces, asserted, and printed in the README."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plan.diff import render_diff
from tests.conftest import prod_config
from tests.support.plans import plan_twice

ROOT = Path(__file__).resolve().parent.parent
NS = "llm-cluster"
GREEN_IMAGE = "vllm/vllm-openai:v0.19.1"


def pools(config: dict[str, Any]) -> dict[str, Any]:
    return config[f"{NS}:pools"]


def free_gpu06(config: dict[str, Any]) -> None:
    """Runbooks 1 and 2, step 1: gpu-06 leaves chat (an up of its own: its server must be gone first)."""
    pools(config)["chat"]["nodes"].remove("gpu-06")


def gpu06_joins_reasoning(config: dict[str, Any]) -> None:
    """Runbook 1, step 2: reasoning grows to three nodes (PP 3)."""
    free_gpu06(config)
    pools(config)["reasoning"]["nodes"].append("gpu-06")
    pools(config)["reasoning"]["pipelineParallel"] = 3


def green_on_gpu06(config: dict[str, Any]) -> None:
    """Runbook 2, step 2: a green pool of the same model on the freed gpu-06 (here: a new engine image)."""
    free_gpu06(config)
    green = json.loads(json.dumps(pools(config)["chat"]))
    green.update(nodes=["gpu-06"], image=GREEN_IMAGE)
    pools(config)["chat-green"] = green


def free_gpu05(config: dict[str, Any]) -> None:
    """Runbook 2, cut-over: blue gives up one more node..."""
    green_on_gpu06(config)
    pools(config)["chat"]["nodes"].remove("gpu-05")


def green_takes_gpu05(config: dict[str, Any]) -> None:
    """...and green takes it, in the next up."""
    free_gpu05(config)
    pools(config)["chat-green"]["nodes"].insert(0, "gpu-05")


def add_gpu07_to_chat(config: dict[str, Any]) -> None:
    """Runbook 3: a seventh server joins the chat pool."""
    config[f"{NS}:nodes"]["gpu-07"] = {"address": "192.168.10.17"}
    pools(config)["chat"]["nodes"].append("gpu-07")


def diff_of(
    tmp_path: Path, before: Callable[[dict[str, Any]], None] | None, after: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    old, new = prod_config(), prod_config()
    if before:
        before(old)
    after(new)
    return plan_twice(tmp_path, old, new)["diff"]


def containers(diff: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["op"] for c in diff["resources"] if c["type"] == "docker:index/container:Container"}


def readme_block(title: str) -> str:
    """The diff printed under a runbook's heading in the README (between its ``` fences)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"#### {title}\n", 1)[1]
    return section.split("```text\n", 1)[1].split("```", 1)[0]


def assert_in_readme(title: str, diff: dict[str, Any]) -> None:
    """The README shows what the tool prints: the summary and the service impact."""
    lines = render_diff(diff)
    printed = lines[lines.index("\nService impact") + 1 :]
    summary = next(ln for ln in lines if ln.startswith("  Resources: "))
    block = readme_block(title).splitlines()
    assert summary in block
    assert [ln for ln in block if ln in printed] == printed


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The whole move in one edit: what the first `make plan` shows."""
    return diff_of(tmp_path_factory.mktemp("move"), None, gpu06_joins_reasoning)


def test_moving_gpu06_touches_only_its_containers_and_the_reasoning_ray_cluster(moved: dict[str, Any]) -> None:
    assert containers(moved) == {
        "chat-gpu-06-vllm": "delete",
        "reasoning-gpu-01-ray-head": "replace",  # PP 2 -> 3: the engine's argv
        "reasoning-gpu-01-ray-worker-gpu-06": "create",
    }
    assert moved["pools"]["chat"]["removed"] == ["chat-gpu-06"]
    assert moved["pools"]["chat"]["servingThroughout"] == 3
    assert moved["pools"]["reasoning"]["restarted"] == ["reasoning-gpu-01"]
    assert moved["services"]["prometheus"] == {"reload": ["monitoring-gpu-01-prometheus"]}
    # In one up the new worker would start while chat's server still holds gpu-06's GPUs.
    assert (
        "node gpu-06: reasoning-gpu-01-ray-worker-gpu-06 would start while chat-gpu-06-vllm still holds its "
        "GPUs (an up creates new resources before it deletes removed ones); free the node first: one up with "
        "the node out of its old pool, then the up that gives it to the new one"
    ) in moved["recommendations"]


def test_moving_gpu06_reloads_the_gateway_without_a_restart(moved: dict[str, Any]) -> None:
    assert "gateway-nginx" not in containers(moved)
    assert moved["services"]["gateway"] == {"reload": ["gateway-nginx"]}


def test_step_1_frees_gpu06_and_chat_serves_on_three(tmp_path: Path) -> None:
    diff = diff_of(tmp_path, None, free_gpu06)
    assert containers(diff) == {"chat-gpu-06-vllm": "delete"}
    assert diff["pools"] == {
        "chat": {**diff["pools"]["chat"], "removed": ["chat-gpu-06"], "restarted": [], "servingThroughout": 3}
    }
    assert diff["services"]["prometheus"] == {"reload": ["monitoring-gpu-01-prometheus"]}
    assert diff["services"]["gateway"] == {"reload": ["gateway-nginx"]}
    assert_in_readme("Free a node", diff)


def test_step_2_gives_gpu06_to_reasoning_after_its_weights(tmp_path: Path) -> None:
    diff = diff_of(tmp_path, free_gpu06, gpu06_joins_reasoning)
    assert containers(diff) == {"reasoning-gpu-01-ray-head": "replace", "reasoning-gpu-01-ray-worker-gpu-06": "create"}
    assert "reasoning-gpu-01-ray-worker-gpu-02" not in containers(diff)
    ops = {c["name"]: c["op"] for c in diff["resources"]}
    assert ops["weights-deepseek-r1-copy-gpu-01-to-gpu-06"] == "create"
    assert diff["pools"]["reasoning"]["waitsForWeights"] == ["weights-deepseek-r1-verify-gpu-06"]
    assert [w["resource"] for w in diff["weights"]] == [
        "weights-deepseek-r1-copy-gpu-01-to-gpu-06",
        "weights-deepseek-r1-verify-gpu-06",
    ]
    assert not [r for r in diff["recommendations"] if r.startswith("node ")]  # gpu-06 is free by now
    assert_in_readme("Move a node between pools", diff)


def test_blue_green_starts_green_beside_blue_without_touching_blue(tmp_path: Path) -> None:
    diff = diff_of(tmp_path, free_gpu06, green_on_gpu06)
    assert containers(diff) == {"chat-green-gpu-06-vllm": "create"}
    assert list(diff["pools"]) == ["chat-green"] and diff["pools"]["chat-green"]["added"] == ["chat-green-gpu-06"]
    ops = {c["name"]: c["op"] for c in diff["resources"]}
    assert ops["gpu-06-image-vllm-openai-v0-19-1"] == "create"
    assert diff["services"]["prometheus"] == {"reload": ["monitoring-gpu-01-prometheus"]}
    assert diff["services"]["gateway"] == {"reload": ["gateway-nginx"]}
    assert not diff["recommendations"]
    assert_in_readme("Blue/green of a model", diff)


def test_each_cut_over_step_moves_one_node_from_blue_to_green(tmp_path: Path) -> None:
    diff = diff_of(tmp_path, free_gpu05, green_takes_gpu05)
    assert containers(diff) == {"chat-green-gpu-05-vllm": "create"}
    assert diff["pools"]["chat-green"]["added"] == ["chat-green-gpu-05"]
    assert diff["pools"]["chat-green"]["servingThroughout"] == 1  # gpu-06 serves on
    assert_in_readme("Blue/green of a model: each cut-over step", diff)


def test_adding_capacity_creates_and_restarts_nothing_that_serves(tmp_path: Path) -> None:
    diff = diff_of(tmp_path, None, add_gpu07_to_chat)
    assert containers(diff) == {
        "chat-gpu-07-vllm": "create",
        "monitoring-gpu-07-dcgm-exporter": "create",
        "monitoring-gpu-07-node-exporter": "create",
    }
    assert diff["pools"] == {
        "chat": {
            **diff["pools"]["chat"],
            "added": ["chat-gpu-07"],
            "restarted": [],
            "removed": [],
            "servingThroughout": 4,
            "downAtOnce": 0,
        }
    }
    ops = {c["name"]: c["op"] for c in diff["resources"]}
    assert ops["weights-qwen3-30b-a3b-copy-gpu-03-to-gpu-07"] == "create"
    # Every node's /etc/hosts learns gpu-07: the hosts commands re-run, no container reads their output.
    assert all(ops[f"gpu-0{i}-hosts"] == "replace" for i in range(1, 7))
    assert diff["services"]["prometheus"] == {"reload": ["monitoring-gpu-01-prometheus"]}
    assert diff["services"]["gateway"] == {"reload": ["gateway-nginx"]}
    assert_in_readme("Add capacity", diff)


def canary_weights(config: dict[str, Any]) -> None:
    """Runbook 2: green takes a tenth of the model's traffic."""
    green_on_gpu06(config)
    config[f"{NS}:gateway"]["poolWeights"] = {"chat": 90, "chat-green": 10}


def test_shifting_traffic_between_blue_and_green_only_reloads_the_gateway(tmp_path: Path) -> None:
    diff = diff_of(tmp_path, green_on_gpu06, canary_weights)
    assert containers(diff) == {}
    assert {c["name"]: c["op"] for c in diff["resources"] if c["custom"]} == {"gateway-config": "update"}
    assert diff["services"] == {"gateway": {"reload": ["gateway-nginx"]}} and diff["pools"] == {}
