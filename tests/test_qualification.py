"""The qualification gate: what it runs on each node (planning), where `up` puts it (mock runtime), and its
checks against real releases where they need no GPU:
- the Triton step compiles the gate's own fp16 `tl.dot` kernel for GPUTarget("cuda", 70, 32) with the real
  Triton wheels from PyPI (3.3.0 must fail as vllm#17639 reports, 3.4.0 and 3.6.0 must compile);
- the arch-list step reads `torch.cuda.get_arch_list()`'s source, the arch flags compiled into the real
  torch 2.10.0 wheel from PyPI (its +cu128 build; the image's +cu129 build is not on PyPI).
Wheels are cached under /var/cache/llm-cluster/{triton,torch} and fetched with pip when missing
(tests/support/qualification.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from components.engines.gate import TRITON_DOT_KERNEL
from components.engines.vllm.engine import VLLM_CHECK as CHECK
from components.engines.vllm.facts import IMAGES
from components.planning.load import load_stack_config
from components.planning.qualification import node_qualifications, qualification_script
from components.spec import StackSpec
from plan.harness import ProgramRun
from tests.support.qualification import lint_and_run_gate, torch_wheel, triton_dir

TRITON_VERSIONS = ("3.3.0", "3.4.0", "3.6.0")
TORCH_VERSION = "2.10.0"


def compile_with(version: str, capability: int, tmp_path: Path) -> dict[str, Any]:
    """The gate's kernel compiled by one real Triton release, in a subprocess that imports only it."""
    code = (
        "import json, sys; from components.engines.gate import compile_dot_kernel; "
        f"print(json.dumps(compile_dot_kernel({capability}, sys.argv[1])))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "PYTHONPATH": f"{triton_dir(version)}:{root}",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TRITON_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"stderr": out.stderr}


@pytest.mark.parametrize("version", TRITON_VERSIONS)
def test_the_gates_triton_kernel_compiles_for_sm70_only_from_triton_3_4(version: str, tmp_path: Path) -> None:
    got = compile_with(version, 70, tmp_path)
    assert got["triton"] == version
    if version == "3.3.0":
        # vllm#17639 / #19203 / sglang#7467: fp16 tl.dot below sm_80 dies in ConvertTritonGPUToLLVM.
        assert got["ok"] is False and got["error"] == "PassManager::run failed"
        assert "Unsupported conversion from f16 to f16" in got["stderr"]
    else:
        assert got["ok"] is True and got["tensor_cores"] is False  # FMA: Volta's mma.m8n8k4 is gone


def test_the_same_kernel_uses_tensor_cores_on_sm80_with_triton_3_3(tmp_path: Path) -> None:
    # The failure on sm_70 is the GPU's, not the harness's: the same compile works for Ampere.
    assert compile_with("3.3.0", 80, tmp_path) | {"stderr": ""} == {
        "ok": True,
        "triton": "3.3.0",
        "tensor_cores": True,
        "error": "",
        "stderr": "",
    }


def test_the_triton_facts_agree_with_the_real_compiles(tmp_path: Path) -> None:
    for facts in IMAGES.values():
        if facts.triton in TRITON_VERSIONS:
            assert facts.triton_fp16_dot(70) is compile_with(facts.triton, 70, tmp_path)["ok"], facts.ref


def arch_list_of(wheel: Path) -> list[str]:
    """What torch.cuda.get_arch_list() returns for a wheel: the arch flags compiled into libtorch_python.so
    (torch/csrc/cuda/Module.cpp _cuda_getArchFlags), read from the file without importing it."""
    with zipfile.ZipFile(wheel) as z:
        blob = z.read("torch/lib/libtorch_python.so")
    found = re.findall(rb"sm_\d+[a-z]?(?: (?:sm|compute)_\d+[a-z]?){2,}", blob)
    assert len(set(found)) == 1, found
    return found[0].decode().split()


def gpu_in_arch_list(capability: int, arch_list: list[str]) -> bool:
    """The gate's check 2, as CHECK writes it: f"sm_{major}{minor}" in torch.cuda.get_arch_list()."""
    assert 'arch = f"sm_{major}{minor}"' in CHECK and "arch in archs" in CHECK
    return f"sm_{capability // 10}{capability % 10}" in arch_list


def test_the_arch_list_check_against_the_real_torch_2_10_wheel() -> None:
    wheel = torch_wheel(TORCH_VERSION)
    with zipfile.ZipFile(wheel) as z:
        version = re.search(r"__version__ = '([^']+)'", z.read("torch/version.py").decode()).group(1)  # type: ignore[union-attr]
    assert version == "2.10.0+cu128"
    archs = arch_list_of(wheel)
    assert archs == ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert gpu_in_arch_list(70, archs) and gpu_in_arch_list(80, archs)
    assert not gpu_in_arch_list(60, archs) and not gpu_in_arch_list(61, archs)  # P100 / P40: refused
    # The facts of vLLM 0.19.1's image say the same (for its +cu129 build: unverified, the gate checks it).
    assert IMAGES["vllm/vllm-openai:v0.19.1"].torch_runs_on(70)


# --- what `up` runs ---------------------------------------------------------------------------


def test_one_gate_per_node_and_serving_image_with_the_argvs_served_there(prod_spec: StackSpec) -> None:
    quals = node_qualifications(prod_spec)
    assert [(q.node, q.image) for q in quals] == [(f"gpu-0{i}", "vllm/vllm-openai:v0.19.1") for i in range(1, 7)]
    by_node = {q.node: q for q in quals}
    # The Ray worker node of the reasoning pool serves no argv of its own but runs the image's GPU code.
    assert by_node["gpu-02"].argvs == () and len(by_node["gpu-01"].argvs) == 1
    assert by_node["gpu-01"].argvs[0][:3] == ("vllm", "serve", "/data/models/DeepSeek-R1-GPTQ-Int4")
    check = by_node["gpu-03"].check
    assert (check.engine, check.entrypoint, check.args[:2]) == ("vLLM 0.19.1", "python3", ("-c", CHECK))
    facts = json.loads(check.args[2])
    assert facts == {
        "version": "0.19.1",
        "module": "vllm",
        "block": 16,
        "kernel": TRITON_DOT_KERNEL,
        "capability": 70,
        "recommended": "vllm/vllm-openai:v0.19.1",
        "argvs": [list(a) for a in by_node["gpu-03"].argvs],
    }


def test_an_image_without_facts_gets_no_gate_but_the_packs_advisory(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["image"] = "registry.local/vllm:dev"
    assert {q.image for q in node_qualifications(load_stack_config(config, set()))} == {"vllm/vllm-openai:v0.19.1"}


def test_the_gate_script_runs_the_image_on_one_gpu_and_is_shellcheck_clean(
    prod_spec: StackSpec, tmp_path: Path
) -> None:
    q = next(q for q in node_qualifications(prod_spec) if q.node == "gpu-03")
    script = qualification_script(q)
    assert 'docker run --rm --gpus device=0 --network none \\\n    --entrypoint python3 "$image" -c ' in script
    # A docker that answers as a failing check would: the gate stops, names the node, shows the lines.
    run = lint_and_run_gate(script, tmp_path, 'echo \'{"check": "triton-fp16-dot", "ok": false}\'\nexit 1')
    assert run.returncode == 1
    assert '{"check": "triton-fp16-dot", "ok": false}' in run.stdout
    assert (
        "qualification: vllm/vllm-openai:v0.19.1 cannot serve on gpu-03 (GPU 0); the failed checks above say why"
        in run.stderr
    )


def test_the_check_is_valid_python_that_reads_its_facts_from_argv() -> None:
    compile(CHECK, "<check>", "exec")
    assert "sys.argv[1]" in CHECK and "sys.exit(1 if failed else 0)" in CHECK


def test_every_server_container_waits_for_its_nodes_gate(prod_run: ProgramRun) -> None:
    gate = prod_run.get("gpu-03-qualify-vllm-openai-v0-19-1-check")
    assert gate.type == "command:remote:Command"
    # The gate needs the pulled image and the node, never the weights: it runs while they copy.
    assert prod_run.get("gpu-03-image-vllm-openai-v0-19-1").urn in gate.dependencies
    assert not [d for d in gate.dependencies if "weights" in d]
    assert gate.urn in prod_run.get("chat-gpu-03-vllm").dependencies
    assert (
        prod_run.get("gpu-02-qualify-vllm-openai-v0-19-1-check").urn
        in prod_run.get("reasoning-gpu-01-ray-worker-gpu-02").dependencies
    )
    assert (
        prod_run.get("gpu-01-qualify-vllm-openai-v0-19-1-check").urn
        in prod_run.get("reasoning-gpu-01-ray-head").dependencies
    )


def test_the_arch_list_of_the_real_torch_2_8_wheel_is_the_0_11_images_fact() -> None:
    # vLLM 0.11.0 requires torch==2.8.0; PyPI's build is +cu128 and compiles sm_70 again (pytorch#157558).
    wheel = torch_wheel("2.8.0")
    with zipfile.ZipFile(wheel) as z:
        version = re.search(r"__version__ = '([^']+)'", z.read("torch/version.py").decode()).group(1)  # type: ignore[union-attr]
        triton = [
            ln
            for ln in z.read("torch-2.8.0.dist-info/METADATA").decode().splitlines()
            if ln.startswith("Requires-Dist: triton==")
        ]
    assert version == "2.8.0+cu128"
    assert triton == ['Requires-Dist: triton==3.4.0; platform_system == "Linux" and platform_machine == "x86_64"']
    facts = IMAGES["vllm/vllm-openai:v0.11.0"]
    assert [f"sm_{c}" for c in facts.torch_arch_list] == arch_list_of(wheel)
    assert (facts.torch, facts.triton) == ("2.8.0+cu128", "3.4.0")
