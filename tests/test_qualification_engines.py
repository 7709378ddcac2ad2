"""The qualification gate of every engine, through the engine seam: LMDeploy and llama.cpp pools get their
gate like vLLM's (one per node and image, what it runs exactly), and each engine's in-image check is run
here for real where it needs no GPU:
- vLLM's check program against vLLM 0.19.1's own Python (the PyPI wheel, unpacked; its compiled extensions
  and dependencies stubbed as components/engines/vllm/tools/dump_vllm_serve_args.py does, torch stubbed without a GPU);
- LMDeploy's against the real lmdeploy 0.16.0 wheel (its required packages stubbed as dump_lmdeploy.py does,
  torch as a stand-in that sees no GPU): TurboMind's real _turbomind.so read for its SASS, lmdeploy's own
  version and `serve api_server` parser;
- llama.cpp's bash check against a real llama-server b11312 (a CPU build of the image's source), in a network
  namespace of its own as `docker run --network none` gives it.
On this machine torch sees no GPU, so the GPU checks fail, as they would on a node without the NVIDIA runtime.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.engines.gate import GateCheck
from components.engines.llamacpp.engine import GATE_MODEL, LLAMACPP_CHECK
from components.engines.lmdeploy.engine import LMDEPLOY_CHECK
from components.engines.vllm.engine import VLLM_CHECK
from components.planning.qualification import node_qualifications, qualification_script
from lab.standins.llamacpp import server_build
from tests.support import tool
from tests.support.engine_stacks import LLAMACPP_IMAGE, LMDEPLOY_IMAGE, llamacpp_config, lmdeploy_config, spec_of
from tests.support.qualification import CACHE, NETWORK_NONE, lint_and_run_gate, python_files, unpacked_wheel

ROOT = Path(__file__).resolve().parents[1]
VLLM_TOOLS = ROOT / "components" / "engines" / "vllm" / "tools"
LMDEPLOY_TOOLS = ROOT / "components" / "engines" / "lmdeploy" / "tools"


def gates(config: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(q.node, q.image): q for q in node_qualifications(spec_of(config))}


# --- which gates, with what ----------------------------------------------------------------------


def test_an_lmdeploy_pool_gets_its_gate_on_every_node_with_its_own_check() -> None:
    found = gates(lmdeploy_config())
    assert sorted(found) == [
        *((f"gpu-0{i}", "vllm/vllm-openai:v0.19.1") for i in (1, 2)),
        *((f"gpu-0{i}", LMDEPLOY_IMAGE) for i in (3, 4, 5, 6)),
    ]
    q = found[("gpu-04", LMDEPLOY_IMAGE)]
    assert q.check.engine == "LMDeploy 0.16.0" and q.check.entrypoint == "python3"
    assert q.check.args[:2] == ("-c", LMDEPLOY_CHECK)
    assert json.loads(q.check.args[2]) == {
        "version": "0.16.0",
        "module": "lmdeploy.version",
        "capability": 70,
        "recommended": "openmmlab/lmdeploy:v0.16.0-cu12.8",
        "argvs": [list(q.argvs[0])],
    }
    assert q.argvs[0][:5] == ("lmdeploy", "serve", "api_server", "/data/models/Qwen3-30B-A3B", "--backend")


def test_a_llamacpp_pool_gets_a_bash_gate_with_its_argvs_pointed_at_no_model() -> None:
    found = gates(llamacpp_config())
    q = found[("gpu-03", LLAMACPP_IMAGE)]
    assert len(q.argvs) == 8  # one server per GPU
    replaced = {"/data/models/Qwen3-30B-A3B/Qwen3-30B-A3B-Q4_K_M.gguf": GATE_MODEL, "192.168.10.13": "127.0.0.1"}
    planned = [shlex.join([replaced.get(a, a) for a in argv]) for argv in q.argvs]
    assert q.check == GateCheck(
        "llama.cpp b11312",
        "/bin/bash",
        (
            "-c",
            LLAMACPP_CHECK,
            "llama-cpp-qualification",
            "/app/llama-server",
            "11312",
            "70",
            "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312",
            *planned,
        ),
        "llama-server's build, the CUDA device it lists and its compute capability, and the planned flags",
    )
    assert all(" -m /nonexistent/llm-cluster-qualification.gguf " in p and " --host 127.0.0.1 " in p for p in planned)


def test_an_image_the_facts_do_not_know_gets_no_gate_for_any_engine() -> None:
    config = lmdeploy_config()
    config["llm-cluster:pools"]["chat"]["image"] = "registry.local/lmdeploy:dev"
    assert {image for _, image in gates(config)} == {"vllm/vllm-openai:v0.19.1"}


@pytest.mark.parametrize("config", [lmdeploy_config, llamacpp_config], ids=["lmdeploy", "llamacpp"])
def test_each_engines_gate_script_is_shellcheck_clean_and_runs_its_entrypoint(config, tmp_path: Path) -> None:
    q = next(q for q in node_qualifications(spec_of(config())) if q.node == "gpu-03")
    script = qualification_script(q)
    assert (
        f'--entrypoint {shlex.quote(q.check.entrypoint)} "$image" ' + " ".join(shlex.quote(a) for a in q.check.args)
    ) in script
    # docker is given exactly the gate's command line (a stand-in docker that writes its argv down).
    run = lint_and_run_gate(script, tmp_path, 'printf "%s\\n" "$@" > "$ARGV_OUT"')
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "argv").read_text() == "\n".join(
        [
            "run",
            "--rm",
            "--gpus",
            "device=0",
            "--network",
            "none",
            "--entrypoint",
            q.check.entrypoint,
            q.image,
            *q.check.args,
        ]
    ) + "\n"


def test_llamacpp_check_is_shellcheck_clean() -> None:
    lint = subprocess.run([tool("shellcheck"), "-s", "bash", "-"], input=LLAMACPP_CHECK, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


# --- the checks, run for real ----------------------------------------------------------------------


def lines(out: str) -> list[dict[str, Any]]:
    """The check's JSON lines (engines log other lines to stdout while they import)."""
    return [json.loads(ln) for ln in out.splitlines() if ln.startswith('{"check"')]


def vllm_source() -> Path:
    """vLLM 0.19.1's Python, unpacked from the PyPI wheel (cached)."""
    return unpacked_wheel("vllm==0.19.1", CACHE / "vllm" / "src-0.19.1", python_files)


VLLM_BOOT = """
import sys
sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]
import re
sys.modules["regex"] = re  # vLLM imports `regex as re`; not installed here, the standard module serves its calls
import dump_vllm_serve_args as stubs
sys.meta_path.append(stubs._StubFinder())
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = CpuPlatform()
exec(compile(sys.argv.pop(1), "<vllm check>", "exec"), {"__name__": "__main__"})
"""


def run_vllm_check(facts: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", VLLM_BOOT, str(VLLM_TOOLS), str(vllm_source()), VLLM_CHECK, json.dumps(facts)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


def test_the_vllm_check_runs_against_vllm_0_19_1s_own_code(prod_spec, tmp_path: Path) -> None:
    q = next(q for q in node_qualifications(prod_spec) if q.node == "gpu-03")
    facts = json.loads(q.check.args[2])
    bad = [*q.argvs[0], "--enable-prefix-cache"]  # a flag 0.19.1 does not have (it is --enable-prefix-caching)
    run = run_vllm_check({**facts, "argvs": [*facts["argvs"], bad]}, tmp_path)
    got = lines(run.stdout)
    assert run.returncode == 1, run.stderr[-2000:]
    assert [(g["check"], g["ok"]) for g in got] == [
        ("torch-sees-gpu", False),
        ("engine-version", True),
        ("argv-parses", True),
        ("argv-parses", False),
    ]
    assert got[1]["detail"] == "vllm 0.19.1, facts expect 0.19.1"
    assert got[2]["detail"] == "vllm serve /data/models/Qwen3-30B-A3B ... parses"
    assert "--enable-prefix-cache" in got[3]["detail"]
    # The same code, held to another version's facts: refused.
    again = lines(run_vllm_check({**facts, "version": "0.9.2", "argvs": []}, tmp_path).stdout)
    assert [g for g in again if g["check"] == "engine-version"] == [
        {
            "check": "engine-version",
            "ok": False,
            "detail": "vllm 0.19.1, facts expect 0.9.2",
            "fix": "the image does not carry vllm 0.9.2: fix the image tag or its declared facts",
        }
    ]


def lmdeploy_root() -> Path:
    """The real lmdeploy 0.16.0 wheel unpacked (cached)."""
    return unpacked_wheel("lmdeploy==0.16.0", CACHE / "lmdeploy" / "0.16.0")


# torch as it answers on a machine without a GPU; lmdeploy's other requirements as dump_lmdeploy.py stubs them.
LMDEPLOY_BOOT = """
import sys, types
sys.path[:0] = [sys.argv.pop(1)]
from pathlib import Path
import dump_lmdeploy as stubs
stubs._install_stubs(Path(sys.argv.pop(1)))
import torch
torch.__version__ = "(no GPU)"
torch.version = types.SimpleNamespace(cuda=None)
torch.cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
exec(compile(sys.argv.pop(1), "<lmdeploy check>", "exec"), {"__name__": "__main__"})
"""


def run_lmdeploy_check(facts: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            LMDEPLOY_BOOT,
            str(LMDEPLOY_TOOLS),
            str(lmdeploy_root()),
            LMDEPLOY_CHECK,
            json.dumps(facts),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(lmdeploy_root())},
    )


def test_the_lmdeploy_check_reads_turbomind_and_lmdeploys_own_parser(tmp_path: Path) -> None:
    q = next(q for q in node_qualifications(spec_of(lmdeploy_config())) if q.node == "gpu-03")
    facts = json.loads(q.check.args[2])
    bad = [*q.argvs[0], "--tensor-parallel", "8"]  # lmdeploy's flag is --tp
    run = run_lmdeploy_check({**facts, "argvs": [*facts["argvs"], bad]}, tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    got = lines(run.stdout)
    assert [(g["check"], g["ok"]) for g in got] == [
        ("torch-sees-gpu", False),
        ("turbomind-kernels", True),
        ("engine-version", True),
        ("argv-parses", True),
        ("argv-parses", False),
    ]
    assert got[1]["detail"] == (
        "_turbomind.cpython-311-x86_64-linux-gnu.so: 91 sm_70 kernels (SASS for sm_70, sm_75, "
        "sm_80, sm_86, sm_89, sm_90, sm_100, sm_120)"
    )
    assert got[2]["detail"] == "lmdeploy.version 0.16.0, facts expect 0.16.0"
    assert got[3]["detail"] == "lmdeploy serve api_server /data/models/Qwen3-30B-A3B ... parses"
    assert "--tensor-parallel" in got[4]["detail"]


def test_the_lmdeploy_check_refuses_a_gpu_turbomind_has_no_kernels_for(tmp_path: Path) -> None:
    # sm_61 (Pascal): the real library has no SASS for it.
    got = lines(
        run_lmdeploy_check(
            {
                "version": "0.16.0",
                "module": "lmdeploy.version",
                "capability": 61,
                "recommended": LMDEPLOY_IMAGE,
                "argvs": [],
            },
            tmp_path,
        ).stdout
    )
    assert [g for g in got if g["check"] == "turbomind-kernels"] == [
        {
            "check": "turbomind-kernels",
            "ok": False,
            "detail": "_turbomind.cpython-311-x86_64-linux-gnu.so: 0 sm_61 kernels (SASS for sm_70, sm_75, sm_80, sm_86, "
            "sm_89, sm_90, sm_100, sm_120)",
            "fix": f"TurboMind in this image has no sm_61 kernels: use {LMDEPLOY_IMAGE}",
        }
    ]


def llama_server() -> Path:
    """llama-server b11312 built for the CPU from the image's source (the lab's build, cached: the source
    vendored in the PyPI sdist llama_cpp_python 0.3.36, components/engines/DATA-SOURCES.md)."""
    return server_build(log=lambda line: print(line, file=sys.stderr))


def run_llamacpp_check(server: Path, capability: int, argvs: list[list[str]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *NETWORK_NONE,
            "bash",
            "-c",
            LLAMACPP_CHECK,
            "llama-cpp-qualification",
            str(server),
            "11312",
            str(capability),
            LLAMACPP_IMAGE,
            *(shlex.join(a) for a in argvs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_the_llamacpp_check_runs_against_a_real_llama_server(tmp_path: Path) -> None:
    server = llama_server()
    q = next(q for q in node_qualifications(spec_of(llamacpp_config())) if q.node == "gpu-03")
    planned = [[str(server), *shlex.split(a)[1:]] for a in q.check.args[7:9]]  # the image's binary -> this build
    bad = [*planned[0], "--cache-type-k", "q3_k"]  # not a cache type of b11312
    run = run_llamacpp_check(server, 70, [*planned, bad])
    assert run.returncode == 1, run.stderr
    got = lines(run.stdout)
    assert got == [
        {"check": "engine-version", "ok": True, "detail": "version: 0.5.0-dev (build 11312, commit 0c1e570)"},
        {
            "check": "gpu-visible",
            "ok": False,
            "detail": "llama-server lists no CUDA device: (none)",
            "fix": "the container sees no GPU, or this build has no CUDA: check the NVIDIA container runtime (docker "
            "info | grep -i runtime), the driver (nvidia-smi), and that the image is a CUDA one "
            f"({LLAMACPP_IMAGE})",
        },
        {"check": "argv-parses", "ok": True, "detail": f"{server} ... parses"},
        {"check": "argv-parses", "ok": True, "detail": f"{server} ... parses"},
        {
            "check": "argv-parses",
            "ok": False,
            "detail": got[4]["detail"],
            "fix": "the planned flags are not this image's: fix the image tag, or the flag the message names",
        },
    ]
    assert got[4]["detail"].startswith('error while handling argument "--cache-type-k"')


def test_the_llamacpp_check_refuses_another_build(tmp_path: Path) -> None:
    server = llama_server()
    run = subprocess.run(
        [
            *NETWORK_NONE,
            "bash",
            "-c",
            LLAMACPP_CHECK,
            "llama-cpp-qualification",
            str(server),
            "9999",
            "70",
            LLAMACPP_IMAGE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert lines(run.stdout)[0] == {
        "check": "engine-version",
        "ok": False,
        "detail": "version: 0.5.0-dev (build 11312, commit 0c1e570)",
        "fix": "the image does not carry llama.cpp b9999: fix the image tag",
    }
