"""The reference stack's pools under Pulumi's mocks: components, containers, gates, dependencies, secrets."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.engines.base import WATCHDOG_SCRIPT, health_probe_argv, watchdog_script
from components.planning.fabric.ray import RAY_HEAD_SCRIPT
from plan.harness import SECRET_SIG, SIG, UNKNOWN, ProgramRun, Registration
from tests.conftest import ROOT
from tests.support import content_trigger, script_of, tool
from tests.support.expected_argv import R1_RAY_HEAD_ARGV

CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"
RAY = "llm-cluster:ray:RayCluster"
SERVER = "llm-cluster:vllm:ModelServer"
NODE = "llm-cluster:node:GpuNode"
POOL_NODES = {"reasoning": ["gpu-01", "gpu-02"], "chat": ["gpu-03", "gpu-04", "gpu-05", "gpu-06"]}
PROBE = health_probe_argv("")[2]
ADDRESS = {f"gpu-0{i}": f"192.168.10.1{i}" for i in range(1, 7)}

MOE_CONFIG = "E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json"


def chat_argv(node: str) -> list[str]:
    return [
        "vllm",
        "serve",
        "/data/models/Qwen3-30B-A3B",
        "--served-model-name",
        "qwen3-30b-a3b",
        "/data/models/Qwen3-30B-A3B",
        "--host",
        ADDRESS[node],
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
        "--distributed-executor-backend",
        "mp",
        "--dtype",
        "half",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "128",
        "--gpu-memory-utilization",
        "0.9",
        "--attention-backend",
        "TRITON_ATTN",
        "--shutdown-timeout",
        "60",
    ]


def env_of(node: str) -> list[str]:
    # vLLM 0.19.1 reads no VLLM_USE_V1; the reasoning pool turns MLA off, the chat pool names its MoE configs.
    pool_env = (
        ["VLLM_MLA_DISABLE=1"]
        if node in ("gpu-01", "gpu-02")
        else ["VLLM_TUNED_CONFIG_FOLDER=/opt/llm-cluster/moe-configs"]
    )
    return sorted(
        [
            "VLLM_WORKER_MULTIPROC_METHOD=spawn",
            "NCCL_IB_DISABLE=0",
            "NCCL_IB_HCA=mlx5_0",
            "NCCL_IB_GID_INDEX=3",
            "NCCL_SOCKET_IFNAME=bond0",
            "GLOO_SOCKET_IFNAME=bond0",
            "NCCL_DEBUG=WARN",
            *pool_env,
            f"VLLM_HOST_IP={ADDRESS[node]}",
            # The hub and telemetry off (pools.*.offline), in the Ray containers too.
            "HF_HUB_OFFLINE=1",
            "TRANSFORMERS_OFFLINE=1",
            "VLLM_NO_USAGE_STATS=1",
            "DO_NOT_TRACK=1",
            "RAY_USAGE_STATS_ENABLED=0",
        ]
    )


def labels(role: str, pool: str, instance: str, node: str) -> list[dict[str, str]]:
    return [
        {"label": f"llm-cluster.{k}", "value": v}
        for k, v in [
            ("role", role),
            ("pool", pool),
            ("instance", instance),
            ("node", node),
            ("gpu-model", "Tesla V100-SXM2-32GB"),
            ("image", "vllm/vllm-openai:v0.19.1"),
            ("engine", "vllm"),
        ]
    ]


def by_urn(run: ProgramRun) -> dict[str, Registration]:
    return {r.urn: r for r in run.registrations}


def mine(run: ProgramRun) -> list[Registration]:
    """Registrations of the pool components and their children."""
    top = {r.urn for r in run.registrations if r.type in (RAY, SERVER)}
    return [r for r in run.registrations if r.urn in top or r.parent in top]


def closure(run: ProgramRun, reg: Registration) -> set[str]:
    """Every URN a resource waits for, directly or through others (parents' waits included)."""
    urns = by_urn(run)
    seen: set[str] = set()
    todo = list(reg.dependencies)
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        todo += urns[u].dependencies if u in urns else []
    return seen


def node_of(run: ProgramRun, urn: str) -> str | None:
    """The node a resource belongs to: its GpuNode ancestor, or a node named in its name."""
    urns = by_urn(run)
    r = urns.get(urn)
    while r is not None:
        if r.type == NODE:
            return r.name
        r = urns.get(r.parent)
    found = re.findall(r"gpu-0[1-6]", urn.rsplit("::", 1)[-1])
    return found[-1] if found else None


def pool_of(run: ProgramRun, urn: str) -> str | None:
    """The pool a resource belongs to, when it is one of the pool components or their children."""
    urns = by_urn(run)
    r = urns.get(urn)
    while r is not None:
        if r.type in (RAY, SERVER):
            return r.inputs["pool"]
        r = urns.get(r.parent)
    return None


def test_reference_pools_register_these_components_and_children(prod_run: ProgramRun) -> None:
    regs = mine(prod_run)
    assert Counter(r.type for r in regs) == {SERVER: 5, RAY: 1, CONTAINER: 6, COMMAND: 8}
    parent_name = {r.urn: r.name for r in prod_run.registrations}
    assert sorted((r.name, parent_name.get(r.parent, "stack")) for r in regs if r.custom) == sorted(
        [
            ("reasoning-gpu-01-ray-head", "reasoning-gpu-01-ray"),
            ("reasoning-gpu-01-ray-worker-gpu-02", "reasoning-gpu-01-ray"),
            ("reasoning-gpu-01-ray-gate", "reasoning-gpu-01-ray"),
            ("reasoning-gpu-01-ray-rdma", "reasoning-gpu-01-ray"),
            ("reasoning-gpu-01-ray-nccl", "reasoning-gpu-01-ray"),
            ("reasoning-gpu-01-health", "reasoning-gpu-01"),
            *[(f"chat-{n}-vllm", f"chat-{n}") for n in POOL_NODES["chat"]],
            *[(f"chat-{n}-health", f"chat-{n}") for n in POOL_NODES["chat"]],
        ]
    )
    assert {r.name for r in regs if not r.custom} == {
        "reasoning-gpu-01-ray",
        "reasoning-gpu-01",
        "chat-gpu-03",
        "chat-gpu-04",
        "chat-gpu-05",
        "chat-gpu-06",
    }
    assert all(r.parent.endswith("::llm-cluster-prod") for r in regs if not r.custom)


def test_stack_exports_each_instance_endpoint(prod_run: ProgramRun) -> None:
    assert prod_run.stack_outputs["endpoints"] == {
        "reasoning-gpu-01": "http://192.168.10.11:8000",
        **{f"chat-{n}": f"http://{ADDRESS[n]}:8000" for n in POOL_NODES["chat"]},
    }


def _gpu_container_common(
    c: dict[str, Any], shm_gib: int, model_path: str, extra_volumes: list[dict[str, Any]] | None = None
) -> None:
    assert c["networkMode"] == "host" and c["gpus"] == "all"
    # A private /dev/shm of shmSizeGib: with ipcMode host docker would mount the host's and ignore it.
    assert "ipcMode" not in c and c["shmSize"] == shm_gib * 1024
    assert c["restart"] == "unless-stopped" and c["destroyGraceSeconds"] == 60 and c["init"] is True
    assert c["volumes"] == [
        {"hostPath": model_path, "containerPath": model_path, "readOnly": True},
        *(extra_volumes or []),
    ]
    assert "deviceRequests" not in c


def test_ray_head_runs_its_script_with_the_vllm_argv_as_command(prod_run: ProgramRun) -> None:
    reg = prod_run.get("reasoning-gpu-01-ray-head")
    c = reg.plain_inputs()
    assert c["name"] == "ray-head-reasoning-gpu-01"
    assert c["entrypoints"] == ["/bin/bash", RAY_HEAD_SCRIPT]
    # Once every GPU has joined, ray-head.sh execs the NCCL check, which execs the watchdog over NET/IB
    # only (tests/test_nccl_check.py); the watchdog runs and supervises vLLM.
    assert c["command"] == [
        "/bin/bash",
        "/opt/llm-cluster/nccl/nccl-check.sh",
        "/bin/bash",
        WATCHDOG_SCRIPT,
        *R1_RAY_HEAD_ARGV,
    ]
    assert c["envs"] == env_of("gpu-01")
    assert c["labels"] == labels("ray-head", "reasoning", "reasoning-gpu-01", "gpu-01")
    # The host's node-exporter textfile directory, where ray-head.sh writes the cluster's size.
    _gpu_container_common(
        c,
        64,
        "/data/models/DeepSeek-R1-GPTQ-Int4",
        [{"hostPath": "/var/lib/llm-cluster/node-exporter", "containerPath": "/var/lib/llm-cluster/node-exporter"}],
    )
    [upload, watchdog, *checks] = c["uploads"]
    assert [u["file"] for u in checks] == [
        "/opt/llm-cluster/nccl/nccl-check.sh",
        "/opt/llm-cluster/nccl/nccl_check.py",
        "/opt/llm-cluster/nccl/fabric.py",
    ]
    assert upload["file"] == RAY_HEAD_SCRIPT and upload["executable"] is True
    assert (
        "ray start --head --port=6379 --node-ip-address=192.168.10.11 --num-gpus=8 --dashboard-host=192.168.10.11 "
        "--dashboard-port=8265 --ray-client-server-port=10001 --disable-usage-stats\n"
    ) in upload["content"]
    assert "textfile=/var/lib/llm-cluster/node-exporter/llm-ray-reasoning-gpu-01.prom\n" in upload["content"]
    assert upload["content"].rstrip().endswith('exec "$@"')
    assert watchdog == {
        "file": WATCHDOG_SCRIPT,
        "executable": True,
        "content": watchdog_script("http://192.168.10.11:8000/health", load_timeout_s=1800, unhealthy_after_s=300),
    }
    assert c["healthcheck"] == {
        "tests": ["CMD", "python3", "-c", PROBE, "http://192.168.10.11:8000/health"],
        "interval": "30s",
        "timeout": "10s",
        "retries": 3,
        "startPeriod": "1800s",
    }
    assert reg.options["deleteBeforeReplace"] is True
    assert reg.provider.split("::")[-2].endswith("gpu-01-docker")


def test_ray_worker_joins_the_head_after_it(prod_run: ProgramRun) -> None:
    reg = prod_run.get("reasoning-gpu-01-ray-worker-gpu-02")
    c = reg.plain_inputs()
    assert c["name"] == "ray-worker-reasoning-gpu-01"
    assert [*c["entrypoints"], *c["command"]] == [
        "ray",
        "start",
        "--block",
        "--address=192.168.10.11:6379",
        "--node-ip-address=192.168.10.12",
        "--num-gpus=8",
        "--disable-usage-stats",
    ]
    assert c["envs"] == env_of("gpu-02")
    assert c["labels"] == labels("ray-worker", "reasoning", "reasoning-gpu-01", "gpu-02")
    _gpu_container_common(c, 64, "/data/models/DeepSeek-R1-GPTQ-Int4")
    assert "uploads" not in c and "healthcheck" not in c
    assert prod_run.get("reasoning-gpu-01-ray-head").urn in reg.dependencies
    assert reg.options["deleteBeforeReplace"] is True
    assert reg.provider.split("::")[-2].endswith("gpu-02-docker")


@pytest.mark.parametrize("node", POOL_NODES["chat"])
def test_chat_replica_container(prod_run: ProgramRun, node: str) -> None:
    reg = prod_run.get(f"chat-{node}-vllm")
    c = reg.plain_inputs()
    assert c["name"] == f"vllm-chat-{node}"
    # The entrypoint is replaced (the image's own, the API server module, would get `vllm serve` as
    # arguments): the watchdog runs `vllm serve` and exits when it hangs, so docker restarts it.
    assert c["entrypoints"] == ["/bin/bash", WATCHDOG_SCRIPT]
    assert c["command"] == chat_argv(node)
    # The watchdog, and the V100 MoE tile config the stack names (VLLM_TUNED_CONFIG_FOLDER points at it).
    assert c["uploads"] == [
        {
            "file": WATCHDOG_SCRIPT,
            "executable": True,
            "content": watchdog_script(
                f"http://{ADDRESS[node]}:8000/health", load_timeout_s=1800, unhealthy_after_s=300
            ),
        },
        {
            "file": f"/opt/llm-cluster/moe-configs/{MOE_CONFIG}",
            "executable": False,
            "content": (ROOT / "configs" / "moe" / MOE_CONFIG).read_text(),
        },
    ]
    assert c["envs"] == env_of(node)
    assert c["labels"] == labels("vllm", "chat", f"chat-{node}", node)
    _gpu_container_common(c, 32, "/data/models/Qwen3-30B-A3B")
    # The id of the image pulled on that node, not a tag that could move under the container.
    assert c["image"].startswith("sha256:")
    assert reg.property_dependencies["image"] == [prod_run.get(f"{node}-image-vllm-openai-v0-19-1").urn]
    assert reg.options["deleteBeforeReplace"] is True
    assert reg.provider.split("::")[-2].endswith(f"{node}-docker")


def test_replicas_sharing_a_node_get_their_own_gpus(
    stack_runner: Callable[..., ProgramRun], config: dict[str, Any]
) -> None:
    config["llm-cluster:pools"]["chat"].update(tensorParallel=4, replicasPerNode=2)
    run = stack_runner(config)
    c0 = run.get("chat-gpu-03-r0-vllm").plain_inputs()
    c1 = run.get("chat-gpu-03-r1-vllm").plain_inputs()
    assert "gpus" not in c0
    assert c0["deviceRequests"] == [{"driver": "nvidia", "deviceIds": ["0", "1", "2", "3"], "capabilities": ["gpu"]}]
    assert c1["deviceRequests"][0]["deviceIds"] == ["4", "5", "6", "7"]
    assert c1["command"][c1["command"].index("--port") + 1] == "8001"
    assert "http://192.168.10.13:8001/health" in c1["uploads"][0]["content"]
    assert run.stack_outputs["endpoints"]["chat-gpu-03-r1"] == "http://192.168.10.13:8001"


def test_ray_gate_waits_for_sixteen_gpus_after_both_containers(prod_run: ProgramRun) -> None:
    reg = prod_run.get("reasoning-gpu-01-ray-gate")
    c = reg.plain_inputs()
    head, worker = prod_run.get("reasoning-gpu-01-ray-head"), prod_run.get("reasoning-gpu-01-ray-worker-gpu-02")
    assert {head.urn, worker.urn} <= set(reg.dependencies)
    assert c["connection"]["host"] == "192.168.10.11"
    script = script_of(c["create"])
    assert "status_cmd=(docker exec ray-head-reasoning-gpu-01 ray status --address 192.168.10.11:6379)" in script
    assert "want=16\n" in script and "timeout=300\n" in script
    # Re-run when the script changes or either container is replaced.
    assert c["triggers"][1:] == [head.resource_id, worker.resource_id] and all(c["triggers"])
    assert c["triggers"][0] == content_trigger(script)
    assert reg.options["customTimeouts"] == {"create": "420s"}


def test_health_gates_follow_their_server(prod_run: ProgramRun) -> None:
    multi = prod_run.get("reasoning-gpu-01-health")
    assert set(multi.dependencies) == {
        prod_run.get("reasoning-gpu-01-ray-gate").urn,
        prod_run.get("reasoning-gpu-01-ray-nccl").urn,
        prod_run.get("reasoning-gpu-01-ray-head").urn,
    }
    assert multi.plain_inputs()["triggers"][1:] == [prod_run.get("reasoning-gpu-01-ray-head").resource_id]
    assert "container=ray-head-reasoning-gpu-01\n" in script_of(multi.plain_inputs()["create"])
    for n in POOL_NODES["chat"]:
        gate = prod_run.get(f"chat-{n}-health")
        c = gate.plain_inputs()
        assert gate.dependencies == [prod_run.get(f"chat-{n}-vllm").urn]
        assert c["connection"]["host"] == ADDRESS[n]
        script = script_of(c["create"])
        assert f"url=http://{ADDRESS[n]}:8000/health\n" in script and "timeout=1800\n" in script
        assert gate.options["customTimeouts"] == {"create": "1920s"}


def test_every_generated_script_is_valid_shellcheck_clean_bash(prod_run: ProgramRun, tmp_path: Path) -> None:
    scripts = {"ray-head.sh": prod_run.get("reasoning-gpu-01-ray-head").plain_inputs()["uploads"][0]["content"]}
    for r in mine(prod_run):
        if r.type == COMMAND:
            scripts[r.name] = script_of(r.plain_inputs()["create"])
    assert len(scripts) == 9  # with the RDMA and NCCL checks of the Ray instance
    shellcheck = tool("shellcheck")
    for name, text in scripts.items():
        path = tmp_path / name
        path.write_text(text)
        assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, name
        lint = subprocess.run([shellcheck, str(path)], capture_output=True, text=True)
        assert lint.returncode == 0, f"{name}:\n{lint.stdout}"


def test_model_server_props_carry_what_the_policy_pack_reads(prod_run: ProgramRun) -> None:
    props = prod_run.get("reasoning-gpu-01").plain_inputs()
    assert {
        k: v
        for k, v in props.items()
        if k not in ("capacity", "capacityWithoutMla", "env", "stackKeys", "contextWindow")
    } == {
        "pool": "reasoning",
        "instance": "reasoning-gpu-01",
        "model": "deepseek-r1",
        "modelPath": "/data/models/DeepSeek-R1-GPTQ-Int4",
        "arch": "deepseek-r1",
        "quantization": "gptq",
        "dtype": "half",
        "gpuModel": "Tesla V100-SXM2-32GB",
        "gpuCount": 8,
        "nodes": ["gpu-01", "gpu-02"],
        "tensorParallel": 8,
        "pipelineParallel": 2,
        "image": "vllm/vllm-openai:v0.19.1",
        "engine": "vllm",
        "qualificationGate": True,
        "argv": R1_RAY_HEAD_ARGV,
        "poolInstances": ["reasoning-gpu-01"],
        # What engine rules check a checkpoint by (policies.rules.engines); no configJson: no quantizationConfig.
        "groupSize": 128,
        "modelType": "deepseek_v3",
        "headDim": 192,
        # What the air-gapped rule reads (policies.rules.airgap).
        "airGapped": False,
        "offline": True,
        # The RAM the pool's servers share on each of its nodes (policies.rules.host_memory).
        "hostMemory": {
            node: {
                "memoryGib": 380,
                "instances": 1,
                "key": f"nodes.{node}.memoryGib, unset: the reference cluster's GPU servers' 380 GiB",
            }
            for node in ("gpu-01", "gpu-02")
        },
    }
    # Where each flag and variable is edited, for the pack's messages (the head node's keys).
    keys = props["stackKeys"]
    assert (keys["--max-model-len"], keys["--dtype"], keys["--host"], keys["NCCL_IB_HCA"], keys["*env"]) == (
        "pools.reasoning.vllm.maxModelLen",
        "models.deepseek-r1.dtype",
        "nodes.gpu-01.address",
        "nodes.gpu-01.hca.device",
        "pools.reasoning.env",
    )
    assert props["contextWindow"] == {
        "tokens": 163840,
        "ropeScaled": True,
        "derivedFrom": "rope_scaling yarn: original_max_position_embeddings=4096 x factor 40",
    }
    assert prod_run.get("chat-gpu-05").plain_inputs()["poolInstances"] == [
        "chat-gpu-03",
        "chat-gpu-04",
        "chat-gpu-05",
        "chat-gpu-06",
    ]
    assert sorted(f"{k}={v}" for k, v in props["env"].items()) == env_of("gpu-01")
    # MLA is off (VLLM_MLA_DISABLE=1): the capacity is the full per-head KV cache's, and there is nothing
    # further to turn off.
    assert props["capacity"]["mla_enabled"] is False and props["capacity"]["fits"] is True
    assert "capacityWithoutMla" not in props and "capacityWithoutMla" not in prod_run.get("chat-gpu-05").plain_inputs()
    assert prod_run.get("chat-gpu-05").plain_inputs()["argv"] == chat_argv("gpu-05")
    assert prod_run.get("reasoning-gpu-01-ray").plain_inputs() == {
        "pool": "reasoning",
        "instance": "reasoning-gpu-01",
        "nodes": ["gpu-01", "gpu-02"],
        "head": "gpu-01",
        "wantGpus": 16,
        "image": "vllm/vllm-openai:v0.19.1",
        "rayPort": 6379,
    }


def test_preview_knows_everything_a_policy_reads_except_the_image_id(prod_preview_run: ProgramRun) -> None:
    for r in mine(prod_preview_run):
        inputs = r.plain_inputs()
        if r.type == CONTAINER:
            assert inputs["image"] == UNKNOWN
            inputs.pop("image")
        if r.type == COMMAND:
            inputs.pop("triggers")  # container ids are unknown until the containers exist
        assert UNKNOWN not in json.dumps(inputs), r.name


def test_each_pool_waits_only_on_its_own_nodes_and_never_on_the_other_pool(prod_run: ProgramRun) -> None:
    for r in mine(prod_run):
        pool = r.inputs.get("pool") if not r.custom else pool_of(prod_run, r.urn)
        for dep in closure(prod_run, r):
            assert pool_of(prod_run, dep) in (None, pool), f"{r.name} waits on {dep}"
            node = node_of(prod_run, dep)
            assert node is None or node in POOL_NODES[pool], f"{r.name} ({pool}) waits on {dep} of {node}"


def test_containers_wait_for_their_node_image_and_weights_only(prod_run: ProgramRun) -> None:
    urns = by_urn(prod_run)
    head = prod_run.get("reasoning-gpu-01-ray-head").urn
    for r in mine(prod_run):
        if r.type != CONTAINER:
            continue
        node = r.plain_inputs()["labels"][3]["value"]
        deps = set(r.dependencies) - {head}  # a worker also waits for its head, which is on another node
        assert prod_run.get(f"{node}-image-vllm-openai-v0-19-1").urn in deps, r.name
        weights = [d for d in deps if urns[urns[d].parent].type == "llm-cluster:weights:ModelWeights"]
        assert weights and {node_of(prod_run, d) for d in weights} == {node}, r.name
        assert {node_of(prod_run, d) for d in deps} == {node}, r.name


def test_nothing_outside_a_pool_waits_for_model_loading(prod_run: ProgramRun) -> None:
    gates = {r.urn for r in mine(prod_run) if r.type == COMMAND}
    inside = {r.urn for r in mine(prod_run)}
    # The smoke test is the one thing meant to come after every server (components.resources.smoke).
    smoke = {r.urn for r in prod_run.registrations if "llm-cluster:smoke:SmokeTest" in r.urn}
    for r in prod_run.registrations:
        if r.urn not in inside | smoke:
            assert not (closure(prod_run, r) & gates), f"{r.name} waits for a pool's readiness gate"


def test_ssh_secrets_stay_secret_in_every_pool_resource(
    stack_runner: Callable[..., ProgramRun], config: dict[str, Any]
) -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-pools-test\n-----END OPENSSH PRIVATE KEY-----"
    config["llm-cluster:sshPrivateKey"] = key
    run = stack_runner(config, {"llm-cluster:sshPrivateKey"})
    for r in mine(run):
        shown = json.dumps(r.display_inputs())
        assert "b3BlbnNzaC1rZXktdjEAAAAA" not in shown, r.name
        if r.type == COMMAND:
            # The command provider wraps the whole connection as a secret.
            assert r.inputs["connection"].get(SIG) == SECRET_SIG
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in json.dumps(run.stack_outputs)
