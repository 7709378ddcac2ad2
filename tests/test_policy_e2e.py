"""End to end: the real program under Pulumi's mocks, its registrations through the real policy pack
(plan.analyze). The reference stack plans clean; stacks changed in one place fail naming the rule."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml

from plan.analyze import Violation, analyze
from plan.harness import ProgramRun, Registration
from tests.conftest import ROOT, prod_config, run_stack
from tests.support.policies import NS, ONE_CHANGE, QWEN


def mandatory(violations: list[Violation]) -> list[tuple[str, str]]:
    return sorted({(v.policy_name, v.resource_name) for v in violations if v.enforcement_level == "mandatory"})


@pytest.mark.parametrize("run_name", ["prod_run", "prod_preview_run"])
def test_reference_stack_plans_without_mandatory_violations(run_name: str, request: pytest.FixtureRequest) -> None:
    run: ProgramRun = request.getfixturevalue(run_name)
    assert run.by_type("llm-cluster:vllm:ModelServer"), "the program registers no ModelServer"
    violations = analyze(run.registrations)
    assert mandatory(violations) == []
    # The one advisory the reference stack carries on purpose (see Pulumi.prod.yaml): without MLA the
    # reasoning pool's KV cache holds about 2.6 sequences of 8192 tokens.
    assert {(v.policy_name, v.resource_name) for v in violations if v.enforcement_level == "advisory"} == {
        ("memory-headroom", "reasoning-gpu-01")
    }


@pytest.mark.parametrize("change", sorted(ONE_CHANGE))
def test_a_one_change_stack_fails_naming_the_rule(change: str) -> None:
    edit, policy, resource = ONE_CHANGE[change]
    config = prod_config()
    edit(config)
    violations = analyze(run_stack(config, preview=True).registrations)
    assert (policy, resource) in mandatory(violations)
    # Only what the change broke: every other mandatory violation is of the same rule.
    assert {p for p, _ in mandatory(violations)} == {policy}


def _stack_file(tmp_path: Any, config: dict[str, Any]) -> str:
    path = tmp_path / "Pulumi.changed.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return str(path)


def _plan(out: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m plan --quiet` writing under `out`, as a CI step runs it."""
    return subprocess.run(
        [sys.executable, "-m", "plan", "--quiet", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_plan_exits_1_naming_the_rule_and_0_on_the_reference(tmp_path: Any) -> None:
    config = prod_config()
    reference = _plan(tmp_path / "reference", "--config", _stack_file(tmp_path, config))
    assert reference.returncode == 0, reference.stderr
    QWEN(config)["dtype"] = "bfloat16"
    changed = _plan(tmp_path / "out", "--config", _stack_file(tmp_path, config))
    assert changed.returncode == 1, changed.stderr
    plan_json = (tmp_path / "out" / "changed" / "plan.json").read_text()
    assert '"gpu-dtype"' in plan_json and "--dtype bfloat16: bfloat16 needs compute capability 8.0" in plan_json


def test_a_gateway_without_auth_is_refused_unless_the_lab_lowers_the_rule(tmp_path: Any) -> None:
    config = prod_config()
    config[NS + "gateway"].update(auth=False, apiKeys=[])
    registrations = run_stack(config, preview=True).registrations
    assert mandatory(analyze(registrations)) == [("gateway-auth", "gateway")]
    # The policy config (`--policy-pack-config`) may lower it: a lab then sees an advisory.
    lowered = analyze(registrations, {"gateway-auth": "advisory"})
    assert mandatory(lowered) == [] and "gateway-auth" in {v.policy_name for v in lowered}
    stack = _stack_file(tmp_path, config)
    refused = _plan(tmp_path / "out", "--config", stack)
    assert refused.returncode == 1, refused.stderr
    plan_json = (tmp_path / "out" / "changed" / "plan.json").read_text()
    assert '"gateway-auth"' in plan_json and "gateway.auth is false" in plan_json
    (tmp_path / "lab.json").write_text('{"gateway-auth": "advisory"}')
    lab = _plan(tmp_path / "lab", "--config", stack, "--policy-config", str(tmp_path / "lab.json"))
    assert lab.returncode == 0, lab.stderr


def test_the_runbooks_deepseek_command_verbatim_is_refused_once_per_cause_on_v100() -> None:
    """Runbook 000 §6.2, copied as is into a ModelServer on the reference cluster's reasoning pool, on the
    runbook's image: each reason it dies on V100 is one mandatory violation naming its evidence."""
    argv = (
        "vllm serve /data/models/DeepSeek-R1-GPTQ-Int4 --tensor-parallel-size 8 --pipeline-parallel-size 2 "
        "--dtype half --gpu-memory-utilization 0.92 --max-model-len 16384 --max-num-seqs 32 "
        "--enable-prefix-caching --enable-chunked-prefill --port 8000"
    ).split()
    props = {
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
        "image": "vllm/vllm-openai:v0.9.2",
        "argv": argv,
        "env": {"VLLM_USE_V1": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
        "capacity": None,
    }
    urn = "urn:pulumi:prod::llm-cluster::llm-cluster:vllm:ModelServer::reasoning-gpu-01"
    reg = Registration(urn, "llm-cluster:vllm:ModelServer", "reasoning-gpu-01", "", False, props, [], {}, "", {})
    found = [(v.policy_name, v.enforcement_level, v.message.split("\n", 1)[1]) for v in analyze([reg])]
    assert [(p, level) for p, level, _ in found] == [
        ("quantization-moe", "mandatory"),
        ("triton-fp16-dot", "mandatory"),
        ("gpu-chunked-prefill-prefix-caching", "mandatory"),
        ("gpu-chunked-prefill-prefix-caching", "mandatory"),
        ("mla-attention", "mandatory"),
        ("vllm-image", "mandatory"),
    ]
    evidence = {p: m for p, _, m in found}
    assert (
        "no FusedMoE method for gptq" in evidence["quantization-moe"] and "vllm#22001" in evidence["quantization-moe"]
    )
    assert evidence["triton-fp16-dot"].startswith(
        "the prefix-prefill attention kernel (chunked prefill / prefix "
        "caching), Triton MLA decode: Triton 3.3.0 in image"
    )
    assert "vllm#14016" in evidence["mla-attention"] and "VLLM_MLA_DISABLE=1" in evidence["mla-attention"]
    assert "torch 2.7.0+cu128" in evidence["vllm-image"] and "pytorch#147607" in evidence["vllm-image"]
    assert [m.split(":")[0] for p, _, m in found if p == "gpu-chunked-prefill-prefix-caching"] == [
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
    ]


def test_the_runbooks_ray_head_command_opens_the_dashboard() -> None:
    """Runbook 000 §6.1: `ray start --head --port=6379 --dashboard-host=0.0.0.0 --block` in a raw container."""
    props = {
        "networkMode": "host",
        "entrypoints": ["ray"],
        "command": ["start", "--head", "--port=6379", "--dashboard-host=0.0.0.0", "--block"],
        "envs": ["NCCL_IB_HCA=mlx5_0", "NCCL_IB_GID_INDEX=3", "NCCL_SOCKET_IFNAME=bond0"],
        "image": "vllm/vllm-openai:v0.9.2",
    }
    urn = "urn:pulumi:prod::llm-cluster::docker:index/container:Container::ray-head"
    reg = Registration(urn, "docker:index/container:Container", "ray-head", "", True, props, [], {}, "", {})
    assert [(v.policy_name, v.message.split("\n", 1)[1]) for v in analyze([reg])] == [
        (
            "internal-ports",
            "ray start --dashboard-host=0.0.0.0 opens Ray's dashboard (job submission = code "
            "execution) on every interface. Bind it to the node's cluster address or leave it on "
            "127.0.0.1.",
        ),
        # The runbook's `docker run -d --name ray-head …` has no --restart: a reboot leaves the pool down.
        (
            "container-restart",
            "restart is no: the container stays down after it exits and after a reboot of the "
            'node. Set restart="unless-stopped".',
        ),
    ]


def test_the_pack_starts_the_way_the_cli_runs_it() -> None:
    """`python -m pulumi.policy <engine> <packDir>` with cwd = policies/: it prints its gRPC port and serves."""
    import queue
    import threading

    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "."],
        cwd=ROOT / "policies",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    # readline() has no timeout: read the first line in a thread and wait for it a bounded time.
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def stop() -> str:
        """End the server, then read its stderr (reading a running server's stderr would block forever)."""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        reader.join(timeout=30)
        return proc.stderr.read()  # type: ignore[union-attr]

    try:
        try:
            first: str | None = lines.get(timeout=60).strip()
        except queue.Empty:
            first = None
        if first is None or not first.isdigit():
            rc = proc.poll()
            err = stop()
            said = "no line within 60 s" if first is None else f"first line {first!r}"
            pytest.fail(f"the pack did not print its port ({said}; exit status {rc}); stderr:\n{err}")
        assert proc.poll() is None, stop()
        _ask_the_server(int(first))
    finally:
        stop()
        proc.stdout.close()
        proc.stderr.close()


def _ask_the_server(port: int) -> None:
    """What the engine asks a started pack over gRPC: its policies, then a verdict on one resource."""
    import grpc
    from google.protobuf import empty_pb2, struct_pb2
    from pulumi.runtime import proto
    from pulumi.runtime.proto import analyzer_pb2_grpc

    from policies.pack import PACK_NAME, POLICIES

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = analyzer_pb2_grpc.AnalyzerStub(channel)
        info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=60)
        assert info.name == PACK_NAME
        assert [p.name for p in info.policies] == [p.name for p in POLICIES]
        # The reference stack's chat container with bf16 on its V100s: the served pack refuses it.
        config = prod_config()
        QWEN(config)["dtype"] = "bfloat16"
        reg = run_stack(config, preview=True).get("chat-gpu-03")
        props = struct_pb2.Struct()
        props.update(reg.inputs)
        got = stub.Analyze(
            proto.AnalyzeRequest(urn=reg.urn, type=reg.type, name=reg.name, properties=props), timeout=60
        )
        assert [(d.policyName, d.enforcementLevel) for d in got.diagnostics] == [("gpu-dtype", proto.MANDATORY)]
        assert "--dtype bfloat16: bfloat16 needs compute capability 8.0" in got.diagnostics[0].message
