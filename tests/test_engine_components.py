"""LMDeploy and llama.cpp pools under Pulumi's mocks: the ModelServer registers each engine's own container
(watchdog, restart, healthcheck in a probe the image has, GPUs), its readiness gate, and the gateway routes
their served names (rewriting to LMDeploy's one name)."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.base import WATCHDOG_SCRIPT
from components.planning.gateway.routing import routes_table
from plan.harness import ProgramRun, Registration
from tests.conftest import prod_config, run_stack
from tests.support.engine_stacks import llamacpp_config, lmdeploy_config, spec_of

CONTAINER = "docker:index/container:Container"
SERVER = "llm-cluster:vllm:ModelServer"


@pytest.fixture(scope="module")
def lmdeploy_run() -> ProgramRun:
    return run_stack(lmdeploy_config())


@pytest.fixture(scope="module")
def llamacpp_run() -> ProgramRun:
    return run_stack(llamacpp_config())


def named(run: ProgramRun, type_: str, name: str) -> Registration:
    [found] = [r for r in run.registrations if r.type == type_ and r.name == name]
    return found


def labels(r: Registration) -> dict[str, str]:
    return {x["label"]: x["value"] for x in r.inputs["labels"]}


def test_lmdeploy_server_container_is_supervised_restarted_and_health_checked(lmdeploy_run: ProgramRun) -> None:
    c = named(lmdeploy_run, CONTAINER, "chat-gpu-03-lmdeploy")
    i = c.inputs
    assert i["name"] == "lmdeploy-chat-gpu-03" and i["restart"] == "unless-stopped" and i["networkMode"] == "host"
    assert i["entrypoints"] == ["/bin/bash", WATCHDOG_SCRIPT]
    assert i["command"][:4] == ["lmdeploy", "serve", "api_server", "/data/models/Qwen3-30B-A3B"]
    assert i["healthcheck"]["tests"][:3] == ["CMD", "python3", "-c"]
    assert i["healthcheck"]["tests"][-1] == "http://192.168.10.13:8000/health"
    watchdog = next(u for u in i["uploads"] if u["file"] == WATCHDOG_SCRIPT)["content"]
    assert "url=http://192.168.10.13:8000/health" in watchdog
    assert labels(c)["llm-cluster.engine"] == "lmdeploy" and labels(c)["llm-cluster.role"] == "lmdeploy"
    assert i["image"] is not None and "NCCL_IB_HCA=mlx5_0" in i["envs"]


def test_lmdeploy_server_props_carry_engine_argv_and_turbomind_capacity(lmdeploy_run: ProgramRun) -> None:
    s = named(lmdeploy_run, SERVER, "chat-gpu-03")
    props: dict[str, Any] = s.inputs
    assert props["engine"] == "lmdeploy" and props["argv"][0] == "lmdeploy"
    assert props["capacity"]["engine"] == "lmdeploy" and props["capacity"]["fits"] is True
    assert props["stackKeys"]["--session-len"] == "pools.chat.lmdeploy.sessionLen"
    gate = named(lmdeploy_run, "command:remote:Command", "chat-gpu-03-health")
    assert "url=http://192.168.10.13:8000/health" in gate.inputs["create"]


def test_llamacpp_servers_get_their_own_gpu_and_a_curl_probe(llamacpp_run: ProgramRun) -> None:
    c = named(llamacpp_run, CONTAINER, "chat-gpu-03-r5-llamacpp")
    i = c.inputs
    assert i["name"] == "llamacpp-chat-gpu-03-r5"
    assert i["deviceRequests"] == [{"driver": "nvidia", "deviceIds": ["5"], "capabilities": ["gpu"]}]
    assert i["command"][0] == "/app/llama-server" and i["command"][i["command"].index("--port") + 1] == "8005"
    assert i["healthcheck"]["tests"] == [
        "CMD",
        "curl",
        "-fsS",
        "-o",
        "/dev/null",
        "--max-time",
        "10",
        "http://192.168.10.13:8005/health",
    ]
    watchdog = next(u for u in i["uploads"] if u["file"] == WATCHDOG_SCRIPT)["content"]
    assert 'healthy() { curl -fsS -o /dev/null --max-time 10 "$url"' in watchdog


def test_gateway_rewrites_lmdeploys_other_names_and_routes_llamacpp_by_every_alias() -> None:
    lm = routes_table(spec_of(lmdeploy_config()))
    # [pool label, pools, location, rewrite-to]: LMDeploy answers one name, the others go out as it.
    assert lm["models"]["qwen3-30b-a3b"][3] == ""
    assert lm["models"]["/data/models/Qwen3-30B-A3B"] == ["chat", {"chat": True}, "@llm_pool_chat", "qwen3-30b-a3b"]
    assert lm["meta"]["qwen3-30b-a3b"] == ["/data/models/Qwen3-30B-A3B", 32768]  # sessionLen
    ll = routes_table(spec_of(llamacpp_config()))
    assert ll["models"]["/data/models/Qwen3-30B-A3B"][3] == ""  # llama-server answers every --alias
    assert ll["meta"]["qwen3-30b-a3b"] == ["/data/models/Qwen3-30B-A3B", 8192]  # contextPerSlot
    assert routes_table(spec_of(prod_config()))["models"]["/data/models/Qwen3-30B-A3B"][3] == ""  # vLLM: every name


def test_readiness_gate_names_the_engines_own_memory_keys(lmdeploy_run: ProgramRun) -> None:
    gate = named(lmdeploy_run, "command:remote:Command", "chat-gpu-03-health").inputs["create"]
    assert "lower pools.chat.lmdeploy.cacheMaxEntryCount or sessionLen" in gate and "gpuMemoryUtilization" not in gate
