"""NCCL preflight: the verdict on real NCCL INFO logs (NET/IB and the Socket fallback), the wrapper and the
deploy gate run for real with stand-ins for python3/docker, and the wiring after the Ray gate."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.node_programs import NODE_PROGRAMS
from components.planning.fabric import nccl
from components.spec import StackSpec
from components.spec.topology import all_instances
from plan.harness import ProgramRun
from tests.support import tool

OPS = Path(__file__).parent / "fixtures" / "ops"


def log(name: str) -> str:
    return next(OPS.glob(f"nccl-debug-info.{name}*")).read_text()


@pytest.fixture(scope="module")
def check() -> Any:
    sys.path.insert(0, str(NODE_PROGRAMS))  # as in the container: fabric.py beside nccl_check.py
    try:
        import nccl_check

        yield nccl_check
    finally:
        sys.path.remove(str(NODE_PROGRAMS))


def reasoning(spec: StackSpec) -> Any:
    return next(i for i in all_instances(spec) if i.uses_ray)


def test_net_ib_on_every_rank_passes(check: Any, prod_spec: StackSpec) -> None:
    plan = nccl.check_plan(prod_spec, reasoning(prod_spec))
    v = check.verdict(
        plan,
        [
            {"host": "gpu-01", "sum_ok": True, "seconds": 0.02, "log": log("net-ib.azure")},
            {"host": "gpu-02", "sum_ok": True, "seconds": 0.03, "log": log("net-ib-roce")},
        ],
    )
    assert v == {
        "ok": True,
        "transport": "IB",
        "devices": ["mlx5_0:1/IB", "mlx5_10:1/RoCE", "mlx5_11:1/RoCE"],
        "message": "all-reduce of 64 MiB over NET/IB (mlx5_0:1/IB, mlx5_10:1/RoCE, mlx5_11:1/RoCE) on 2 "
        "nodes in 0.03 s",
    }


def test_a_socket_fallback_is_refused_naming_the_variables(check: Any, prod_spec: StackSpec) -> None:
    plan = nccl.check_plan(prod_spec, reasoning(prod_spec))
    v = check.verdict(
        plan, [{"sum_ok": True, "log": log("net-ib.azure")}, {"sum_ok": True, "log": log("net-socket-fallback")}]
    )
    assert v["ok"] is False and v["transport"] == "Socket"
    assert v["message"].startswith(
        "NCCL fell back to NET/Socket (eth0:10.244.1.4<0>) after: Failed to open "
        "libibverbs.so[.1]; check NCCL_IB_HCA=mlx5_0"
    )
    assert "NCCL_IB_GID_INDEX=3" in v["message"] and "NCCL_SOCKET_IFNAME=bond0" in v["message"]
    mixed = check.verdict(plan, [{"sum_ok": True, "log": log("mixed")}])
    assert mixed["ok"] is False and "NET/IB : No device found." in mixed["message"]


def test_a_wrong_sum_or_no_ib_line_is_refused(check: Any, prod_spec: StackSpec) -> None:
    plan = nccl.check_plan(prod_spec, reasoning(prod_spec))
    assert (
        check.verdict(plan, [{"sum_ok": False, "log": log("net-ib.azure")}])["message"]
        == "the all-reduce returned a wrong sum"
    )
    assert check.verdict(plan, [{"sum_ok": True, "log": ""}])["message"].startswith("no NET/IB line")


def test_the_check_imports_ray_and_torch_only_when_it_runs() -> None:
    tree = ast.parse((NODE_PROGRAMS / "nccl_check.py").read_text(), feature_version=(3, 8))
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top <= set(sys.stdlib_module_names) | {"__future__", "fabric"}


def fake_python(tmp_path: Path, verdict: str, status: int) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"#!/bin/sh\necho '{verdict}'\nexit {status}\n")
    (bin_dir / "docker").write_text(f"#!/bin/sh\ncat {tmp_path}/result.json\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_over_ib_the_wrapper_keeps_the_verdict_and_execs_the_server(prod_spec: StackSpec, tmp_path: Path) -> None:
    env = fake_python(tmp_path, '{"ok": true, "transport": "IB", "message": "fine"}', 0)
    script = nccl.wrapper_script(
        prod_spec, reasoning(prod_spec), directory=str(tmp_path), result=str(tmp_path / "result.json")
    )
    done = subprocess.run(
        [tool("bash"), "-c", script, "nccl-check.sh", "echo", "server", "started"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "nccl: all-reduce across 2 nodes of reasoning-gpu-01 (NCCL_DEBUG=INFO)",
        'nccl: {"ok": true, "transport": "IB", "message": "fine"}',
        "server started",
    ]
    gate = subprocess.run(
        [tool("bash"), "-c", nccl.gate_script(reasoning(prod_spec), "ray-head-x", 10)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert gate.returncode == 0 and gate.stdout.startswith('nccl reasoning-gpu-01: {"ok": true')


def test_on_sockets_the_server_never_starts_and_the_gate_fails(prod_spec: StackSpec, tmp_path: Path) -> None:
    refused = (
        '{"ok": false, "transport": "Socket", "message": "NCCL fell back to NET/Socket; check NCCL_IB_HCA=mlx5_0"}'
    )
    env = fake_python(tmp_path, refused, 1)
    script = nccl.wrapper_script(
        prod_spec, reasoning(prod_spec), directory=str(tmp_path), result=str(tmp_path / "result.json")
    )
    marker = tmp_path / "served"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [tool("bash"), "-c", script, "nccl-check.sh", "touch", str(marker)],
            capture_output=True,
            text=True,
            env=env,
            timeout=3,
        )
    assert not marker.exists()
    assert (tmp_path / "result.json").read_text() == refused + "\n"
    gate = subprocess.run(
        [tool("bash"), "-c", nccl.gate_script(reasoning(prod_spec), "ray-head-x", 10)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert gate.returncode == 1
    assert gate.stderr == f"ERROR: nccl reasoning-gpu-01: {refused}\n"


def test_scripts_are_shellcheck_clean(prod_spec: StackSpec, tmp_path: Path) -> None:
    inst = reasoning(prod_spec)
    (tmp_path / "w.sh").write_text(nccl.wrapper_script(prod_spec, inst))
    (tmp_path / "g.sh").write_text(nccl.gate_script(inst, "ray-head-reasoning-gpu-01"))
    subprocess.run([tool("shellcheck"), "-s", "bash", str(tmp_path / "w.sh"), str(tmp_path / "g.sh")], check=True)


def test_the_head_runs_the_check_before_the_server_and_the_health_gate_waits_for_it(prod_run: ProgramRun) -> None:
    head = prod_run.get("reasoning-gpu-01-ray-head").plain_inputs()
    assert head["command"][:4] == ["/bin/bash", nccl.WRAPPER, "/bin/bash", "/opt/llm-cluster/vllm-watchdog.sh"]
    assert {u["file"] for u in head["uploads"]} >= {nccl.WRAPPER, f"{nccl.DIR}/nccl_check.py", f"{nccl.DIR}/fabric.py"}
    gate = prod_run.get("reasoning-gpu-01-ray-nccl")
    assert prod_run.get("reasoning-gpu-01-ray-gate").urn in gate.dependencies
    assert gate.urn in prod_run.get("reasoning-gpu-01-health").dependencies


def test_the_check_can_be_switched_off(config: dict[str, Any], stack_runner: Any) -> None:
    config["llm-cluster:preflight"] = {"ncclAllReduce": False}
    run = stack_runner(config)
    assert not [r for r in run.registrations if r.name.endswith("-nccl")]
    assert nccl.WRAPPER not in run.get("reasoning-gpu-01-ray-head").plain_inputs()["command"]
