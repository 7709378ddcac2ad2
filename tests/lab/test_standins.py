"""The vLLM stand-in's torch, triton and parser modules against the qualification gate's own check.

No namespaces needed: the gate's in-image Python for vLLM (components/engines/vllm/engine.py VLLM_CHECK) runs with
the stand-in packages of lab/standins/vllm on its path and the facts the lab bakes into each image, as
`docker run --gpus device=0` gives them (NVIDIA_VISIBLE_DEVICES). The lab tier runs the same inside the
built image on every host.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.engines.vllm.engine import VLLM_CHECK
from components.planning.qualification import Qualification, node_qualifications
from lab import images
from lab.config import LAB_DIR, REPO

STANDINS = LAB_DIR / "standins" / "vllm"
PROGRAM = VLLM_CHECK  # the gate's in-image program for vLLM images


def _site(tmp: Path, tag: str) -> Path:
    """The stand-in's site-packages as images.py lays it out, for vLLM `tag`."""
    facts = images.vllm_facts(tag)
    site = tmp / tag
    for package in ("vllm", "torch", "triton"):
        shutil.copytree(STANDINS / package, site / package)
    shutil.copy2(STANDINS.parent / "openai_http.py", site / "openai_http.py")
    shutil.copy2(facts["dump"], site / "vllm" / "serve-args.json")
    shutil.copy2(facts["metrics"], site / "vllm" / "metrics.txt")
    (site / "vllm" / "version.json").write_text(
        json.dumps({"version": facts["version"], "quantizations": facts["quantizations"]})
    )
    (site / "standin.json").write_text(json.dumps(facts["standin"]))
    return site


def check_input(q: Qualification) -> str:
    """The facts JSON the gate's program reads (argv[1] of `python3 -c PROGRAM FACTS`)."""
    assert q.check.entrypoint == "python3" and q.check.args[0] == "-c"
    return q.check.args[2]


def _gate(site: Path, check_json: str, visible: str | None) -> tuple[int, dict[str, dict]]:
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    if visible is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = visible
    # numpy from the test venv, after the stand-ins (the image installs it beside them)
    import numpy

    env["PYTHONPATH"] += ":" + str(Path(numpy.__file__).parent.parent)
    p = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys, os; sys.path[:0] = os.environ['PYTHONPATH'].split(':');exec(sys.argv.pop(1))",
            PROGRAM,
            check_json,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return p.returncode, {c["check"]: c for c in map(json.loads, p.stdout.splitlines())}


@pytest.fixture(scope="module")
def lab_qualification():
    from components.planning.load import load_stack_config
    from plan.stackfile import load_stack_file

    stack = load_stack_file(REPO / "Pulumi.lab.yaml", "lab")
    spec = load_stack_config(stack.config, stack.secret_keys)
    return next(q for q in node_qualifications(spec) if q.node == "gpu-01")


def test_the_lab_image_passes_the_gate_on_the_hosts_fake_v100(tmp_path: Path, lab_qualification) -> None:
    code, checks = _gate(_site(tmp_path, "v0.19.1"), check_input(lab_qualification), "0")
    assert code == 0, checks
    assert checks["torch-sees-gpu"]["detail"] == "torch 2.10.0+cu129, CUDA 12.9.1, 1 device(s)"
    assert checks["torch-arch-list"]["detail"].startswith("Tesla V100-SXM2-32GB is sm_70; torch has ['sm_70',")
    assert checks["triton-fp16-dot"]["detail"].startswith("triton 3.6.0: fp16 tl.dot on sm_70, max error ")
    assert checks["gpu-as-planned"]["detail"] == "Tesla V100-SXM2-32GB is sm_70; the stack plans sm_70"
    assert checks["engine-version"]["ok"] and checks["argv-parses"]["ok"]


def test_without_gpus_the_gate_fails_on_its_first_check(tmp_path: Path, lab_qualification) -> None:
    code, checks = _gate(_site(tmp_path, "v0.19.1"), check_input(lab_qualification), None)
    assert code == 1
    assert checks["torch-sees-gpu"]["ok"] is False
    assert checks["torch-sees-gpu"]["detail"].endswith("0 device(s)")


def test_the_runbook_image_fails_the_gate_for_its_torch_and_its_triton(tmp_path: Path, lab_qualification) -> None:
    q = json.loads(check_input(lab_qualification))
    q["version"], q["argvs"] = "0.9.2", []
    code, checks = _gate(_site(tmp_path, "v0.9.2"), json.dumps(q), "0")
    assert code == 1
    assert checks["torch-arch-list"]["ok"] is False
    assert "torch has ['sm_75'," in checks["torch-arch-list"]["detail"]
    assert checks["triton-fp16-dot"]["ok"] is False
    assert "Unsupported conversion from f16 to f16" in checks["triton-fp16-dot"]["detail"]
    assert checks["engine-version"]["detail"] == "vllm 0.9.2, facts expect 0.9.2"


def test_a_flag_the_version_does_not_have_fails_argv_parses(tmp_path: Path, lab_qualification) -> None:
    q = json.loads(check_input(lab_qualification))
    q["argvs"] = [q["argvs"][0] + ["--no-such-flag"]]
    code, checks = _gate(_site(tmp_path, "v0.19.1"), json.dumps(q), "0")
    assert code == 1
    assert checks["argv-parses"]["ok"] is False
    assert "--no-such-flag" in checks["argv-parses"]["detail"]
